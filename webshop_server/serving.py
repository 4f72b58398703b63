"""Serving a WSGI app with waitress, as both servers do (the WebShop site and the env server).

Waitress reads each request in full on its event loop before a worker thread sees it, so slow or idle clients
cost a connection, never a thread. What is left to share fairly is the connections: the server keeps up to
``connection_limit`` open (with ``poll``, so past ``select``'s 1,024 descriptors), one client host at most a
quarter of them (:class:`FairShareChannel`: more are closed as they are accepted; a host as
:func:`~webshop_server.clients.client_host` counts it, so several loopback or IPv6 addresses of one host are
one client), and a connection with nothing in flight is closed after ``channel_timeout`` seconds; so one
client holding idle or half-sent connections cannot starve the others or the health checks.

:func:`serve_until_stopped` drains on SIGTERM and SIGINT, also when the signal goes to the whole process group
(Ctrl-C in a terminal, ``systemd``'s default ``KillMode=control-group``, ``kill -TERM -PGID``): it stops
accepting at once, lets the requests in flight finish (at most ``drain_timeout`` seconds: a container's stop
grace period is 10 s by default), then closes and calls ``on_stop``. Helper processes of a server ignore
these signals and are stopped by it (the env server's workers, see ``progpo_envs.server.pool``).

Example:
    >>> from flask import Flask
    >>> server = make_server(Flask("demo"), port=0, threads=2, ident="demo")
    >>> int(server.effective_port) > 0
    True
    >>> server.close()
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable

from waitress.channel import HTTPChannel
from waitress.server import create_server

from webshop_server.clients import client_host

#: Open connections at most (keep-alive ones included); past it the server stops accepting.
CONNECTION_LIMIT = 1024
#: Seconds a connection with no request in flight may stay silent before it is closed.
IDLE_CONNECTION_TIMEOUT = 30
#: Seconds a server waits for the rest of a request it started to read (gunicorn: for its next bytes; the
#: OpenEnv door: for each part of its body) before it drops the connection.
READ_TIMEOUT = 10.0
#: Seconds a stop signal waits for the requests in flight.
DRAIN_TIMEOUT = 8.0
#: The signals that stop a server (with a drain).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def connections_per_host(connection_limit: int) -> int:
    """Open connections one client host may hold: a quarter of the limit, far above any one client's need."""
    return max(1, connection_limit // 4)


class FairShareChannel(HTTPChannel):
    """Waitress's HTTP channel, closed at once if its client host already holds its share of connections."""

    def __init__(self, server, sock, addr, adj, map=None):  # noqa: A002 - waitress's signature
        self.host = client_host(addr[0]) if isinstance(addr, tuple) else None
        super().__init__(server, sock, addr, adj, map)
        if self.host is None:
            return
        channels = list(server.active_channels.values())
        held = sum(1 for channel in channels if getattr(channel, "host", None) == self.host)
        if held > connections_per_host(adj.connection_limit):
            self.close()


def make_server(
    app,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    threads: int,
    ident: str,
    connection_limit: int = CONNECTION_LIMIT,
):
    """A waitress server for ``app`` with fair-share channels (``port=0`` picks a free port: read
    ``server.effective_port``)."""
    server = create_server(
        app,
        host=host,
        port=port,
        threads=threads,
        connection_limit=connection_limit,
        channel_timeout=IDLE_CONNECTION_TIMEOUT,
        cleanup_interval=5,
        asyncore_use_poll=True,
        ident=ident,
    )
    server.channel_class = FairShareChannel
    return server


def requests_in_flight(server) -> int:
    """Connections of ``server`` with a request received and not yet answered in full."""
    return sum(
        1
        for channel in list(server.active_channels.values())
        if channel.requests or channel.total_outbufs_len
    )


def serve_until_stopped(
    server,
    on_stop: Callable[[], None] = lambda: None,
    *,
    name: str,
    drain_timeout: float = DRAIN_TIMEOUT,
    on_signal: Callable[[], None] = lambda: None,
) -> None:
    """Run ``server`` until SIGTERM or SIGINT, then drain: call ``on_signal`` (e.g. stop restarting helpers),
    refuse new connections, finish the requests in flight (at most ``drain_timeout`` seconds), close, and call
    ``on_stop``. ``name`` prefixes the log line."""
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in STOP_SIGNALS}
    loop_map = server._map  # waitress's run() loops over this map; here the loop stops between passes

    def one_pass(timeout: float) -> None:
        server.asyncore.loop(timeout=timeout, map=loop_map, use_poll=True, count=1)

    try:
        while not stopping.is_set():
            one_pass(0.25)
        on_signal()
        print(f"[{name}] stopping: finishing the requests in flight", file=sys.stderr, flush=True)
        server.del_channel()  # no more accepts: new connections are refused, the open ones keep being served
        server.socket.close()
        deadline = time.monotonic() + drain_timeout
        while requests_in_flight(server) and time.monotonic() < deadline:
            one_pass(0.05)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        server.close()
        on_stop()
