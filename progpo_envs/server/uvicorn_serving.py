"""Serving the OpenEnv door with uvicorn, under the native servers' connection rules.

OpenEnv's app runs on uvicorn's event loop, which costs a slow or idle client no thread; but uvicorn itself
holds every connection it accepts for as long as the client likes before the client's first request (it has
no deadline for a request's head), accepts as many as the kernel hands it, and when the process runs out of
descriptors logs every failed accept with its traceback, a thousand a second. So one host holding some
thousand half-sent connections took the door from every other host (health checks, WebSocket handshakes)
and grew its log by megabytes a second. :class:`FairShareProtocol` is uvicorn's HTTP protocol with the
native servers' rules (:mod:`webshop_server.serving`), with their numbers:

* **shares**: a connection is counted in its client host's share as it is accepted, before any header (a
  host as :func:`~webshop_server.clients.client_host` counts it, so every loopback address is one host): one
  host holds at most :func:`~webshop_server.serving.connections_per_host` of the
  :data:`~webshop_server.serving.CONNECTION_LIMIT` HTTP connections; past its share the host's oldest
  connection with no request in flight is closed, or the new one when every one is busy
  (:func:`~webshop_server.serving.connection_to_close`), and past the limit the new one is closed. A
  connection that became a WebSocket session leaves these counts: it counts in the host's share of sessions
  (:class:`~progpo_envs.server.openenv_app.SharedSessionServer`);
* **deadlines**: a connection silent for :data:`~webshop_server.serving.IDLE_CONNECTION_TIMEOUT` seconds
  before its first request, or whose request's head has started and not ended within
  :data:`~webshop_server.serving.READ_TIMEOUT` seconds, is closed (after an answer uvicorn's own keep-alive
  timeout closes a silent connection); a request's body has the same deadline per part, in the app's guard;
* **descriptors**: the open-file limit is raised to what the connections and sessions need
  (:func:`~webshop_server.serving.raise_open_file_limit`), and the kernel hands over at most
  :data:`ACCEPT_BACKLOG` connections a pass, so the ones closed at once never run the process out of
  descriptors;
* **logs**: uvicorn's and asyncio's loggers let one record of a kind through every
  :data:`~webshop_server.serving.LOG_INTERVAL` seconds (:class:`~webshop_server.serving.FloodFilter`).

:func:`uvicorn_config` is the uvicorn ``Config`` of the door with all of these; ``progpo serve --protocol
openenv`` and :class:`~progpo_envs.server.openenv_app.OpenEnvServer` serve with it. (The ``openenv.yaml``
manifests' ``uvicorn --factory`` command runs the same app without them: behind a proxy that has its own.)

uvicorn's protocol internals are used as they are in the locked release (``requirements/lock.txt``); the tests
(``tests/progpo_envs/server/test_hosting_openenv_connections.py``) check the behaviour over sockets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from webshop_server.clients import client_host
from webshop_server.serving import (
    CONNECTION_LIMIT,
    DRAIN_TIMEOUT,
    IDLE_CONNECTION_TIMEOUT,
    READ_TIMEOUT,
    RESERVED_FILES,
    connection_to_close,
    connections_per_host,
    limit_malloc_arenas,
    quiet_floods,
    raise_open_file_limit,
)

#: Connections the kernel queues for accepting, and the most accepted in one pass of the event loop.
ACCEPT_BACKLOG = 256
#: The loggers of a uvicorn server (asyncio's logs failed accepts).
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "asyncio")


class FairShareProtocol(H11Protocol):
    """uvicorn's h11 protocol with per-host shares of connections and deadlines (the module docstring).

    :func:`fair_share_protocol` makes one with other limits (the tests' short deadlines).
    """

    connection_limit: int = CONNECTION_LIMIT
    idle_timeout: float = float(IDLE_CONNECTION_TIMEOUT)
    read_timeout: float = READ_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.host = client_host(self.client[0]) if self.client else None
        self.opened = time.monotonic()
        self.in_flight = False  # a request's head arrived and its answer is not complete
        self._head_started = False
        self._deadline: asyncio.TimerHandle | None = None
        victim = self._to_close()
        if victim is not None:
            victim.transport.close()
        if victim is not self:
            self._arm(self.idle_timeout)

    def _to_close(self) -> FairShareProtocol | None:
        """The connection to close for this one, by the module's rules (``None``: none)."""
        http = [
            c for c in self.connections if isinstance(c, FairShareProtocol) and not c.transport.is_closing()
        ]
        if len(http) > self.connection_limit:
            return self
        if self.host is None:
            return None
        share = connections_per_host(self.connection_limit)
        return connection_to_close(self, http, share, idle=lambda c: not c.in_flight)

    def data_received(self, data: bytes) -> None:
        if not self.in_flight and not self._head_started:  # the first bytes of a request: its head's deadline
            self._head_started = True
            self._arm(self.read_timeout)
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head arrived: in flight until its answer is complete
            self.in_flight, self._head_started = True, False
            self._disarm()

    def handle_websocket_upgrade(self, event: Any) -> None:
        self.in_flight = True  # a WebSocket from now on: its session's rules, not this connection's
        self._disarm()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        self.in_flight = False
        super().on_response_complete()  # uvicorn's keep-alive timeout closes it if it stays silent

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.in_flight:
            self.transport.close()


def fair_share_protocol(
    connection_limit: int = CONNECTION_LIMIT,
    idle_timeout: float = float(IDLE_CONNECTION_TIMEOUT),
    read_timeout: float = READ_TIMEOUT,
) -> type[FairShareProtocol]:
    """:class:`FairShareProtocol` with these limits (the defaults are the native servers')."""
    limits = {
        "connection_limit": connection_limit,
        "idle_timeout": idle_timeout,
        "read_timeout": read_timeout,
    }
    if all(getattr(FairShareProtocol, name) == value for name, value in limits.items()):
        return FairShareProtocol
    return type("FairShareProtocol", (FairShareProtocol,), limits)


def uvicorn_config(
    app: Any,
    *,
    max_sessions: int,
    ws_max_size: int,
    drain_timeout: float = DRAIN_TIMEOUT,
    protocol: type[FairShareProtocol] = FairShareProtocol,
) -> uvicorn.Config:
    """The uvicorn ``Config`` of the OpenEnv door for ``app`` (the module docstring): ``max_sessions`` open
    WebSocket sessions at most beside the HTTP connections, WebSocket messages of at most ``ws_max_size``
    bytes (a larger one closes its connection, code 1009), ``drain_timeout`` seconds for the open connections
    on a stop."""
    raise_open_file_limit(protocol.connection_limit + max_sessions + ACCEPT_BACKLOG + RESERVED_FILES)
    limit_malloc_arenas()
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        ws_max_size=ws_max_size,
        backlog=ACCEPT_BACKLOG,
        timeout_graceful_shutdown=drain_timeout,
        lifespan="on",
    )
    quiet_floods(*SERVER_LOGGERS)  # after the Config, which configures uvicorn's loggers
    return config
