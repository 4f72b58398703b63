"""A hosted env as an OpenEnv environment: OpenEnv's own server on our env pool.

``progpo serve --protocol openenv --env progpo/ALFWorld-v0 --port P`` serves OpenEnv's routes at the root of
the port, from ``openenv``'s own server (:class:`~openenv.core.env_server.http_server.HTTPEnvServer` and its
routes, on the app its ``create_app`` would build; not a copy of its protocol): the stateful WebSocket session
``/ws`` (``reset``, ``step``, ``state``, ``close`` messages and OpenEnv's typed errors), the stateless HTTP
``/reset`` and ``/step``, ``/state``, ``/health``, ``/schema``, ``/metadata``, ``/mcp`` and ``/docs``.
OpenEnv's own ``GenericEnvClient(base_url="http://127.0.0.1:P")`` plays episodes unchanged; the models are
:mod:`~progpo_envs.server.openenv_models`, the sessions
:class:`~progpo_envs.server.openenv_session.PoolSession` (the episodes run in the env pool's workers).

What this module adds around OpenEnv's server (:class:`SharedSessionServer`, :class:`SessionGuard`, an ASGI
middleware, and exception handlers):

* concurrency: OpenEnv's session limit is the pool's instance limit (``--max-instances``, 1024 by default, so
  a trainer's group × batch fits; OpenEnv's own default is one session), and one client (its host) holds at
  most the pool's per-client share of open sessions (``--max-instances-per-client``, half by default),
  however it opened them: a WebSocket on ``/ws`` or ``/mcp``, or HTTP ``POST /mcp``
  ``openenv/session/create`` (:class:`SharedSessionServer`); one more is answered as OpenEnv answers a full
  server (a ``CAPACITY_REACHED`` error frame, a JSON-RPC server error);
* idle expiry: a session idle for ``--idle-timeout`` seconds is ended by OpenEnv's reaper and its instance by
  the pool's, so an abandoned connection frees its slot;
* bad frames keep the connection: OpenEnv answers invalid JSON, unknown message types and invalid actions
  with typed errors itself, but ends the connection on a binary frame or on JSON that is not an object; the
  guard answers those with a typed error frame (``INVALID_JSON``, ``VALIDATION_ERROR``) and keeps reading;
* errors of the stateless HTTP routes are 4xx answers with a message (OpenEnv would answer 500).

:class:`OpenEnvServer` runs the app with uvicorn on a thread (tests, benchmarks, the CLI);
:func:`serve_until_stopped` runs it until SIGTERM or SIGINT, drains (no new connections, the open ones get up
to ``drain_timeout`` seconds) and stops the env workers.

Example:
    >>> from progpo_envs.server.app import ServerConfig
    >>> app = create_openenv_app(ServerConfig(env_ids=("progpo/ALFWorld-v0",)))  # doctest: +SKIP
    >>> with OpenEnvServer(app) as server:  # doctest: +SKIP
    ...     from openenv import GenericEnvClient
    ...     with GenericEnvClient(base_url=server.url).sync() as env:
    ...         result = env.reset(task_index=0, split="train")
    ...         result = env.step({"command": result.observation["admissible_actions"][0]})
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import ConcurrencyConfig, ServerMode, WSErrorCode, WSErrorResponse

from progpo_envs.core.registration import env_statements, listed_splits
from progpo_envs.server.app import ServerConfig
from progpo_envs.server.openenv_models import CommandAction, TextEnvState, observation_class
from progpo_envs.server.openenv_session import (
    CLIENT_ADDRESS,
    PoolSession,
    SessionError,
    SessionHost,
    environment_metadata,
)
from progpo_envs.server.policy import PolicyError
from progpo_envs.server.pool import EnvPool
from progpo_envs.server.request_args import MAX_REQUEST_BYTES
from progpo_envs.server.serving import DEFAULT_THREADS
from webshop_server.clients import client_host
from webshop_server.serving import DRAIN_TIMEOUT


def _error_frame(message: str, code: WSErrorCode) -> str:
    return WSErrorResponse(data={"message": message, "code": code}).model_dump_json()


class SessionGuard:
    """ASGI middleware of the OpenEnv app: the client's host for the shares, frames kept in line.

    Args:
        app: OpenEnv's app.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        # the client is its host, as on the native routes (webshop_server.clients): several loopback
        # addresses of one machine are one client (tokens name clients on the native routes only)
        address = client_host(scope["client"][0]) if scope.get("client") else None
        token = CLIENT_ADDRESS.set(address)
        try:
            if scope["type"] == "websocket" and scope.get("path") == "/ws":
                receive = self._frames(receive, send)
            await self.app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    @staticmethod
    def _frames(receive: Callable, send: Callable) -> Callable:
        """``receive`` that answers the frames OpenEnv's loop would end the connection on, and reads on.

        OpenEnv's loop only receives while it is not sending, so an error frame sent here never interleaves
        with one of its answers.
        """

        async def guarded() -> dict:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                text = message.get("text")
                if text is None:
                    await send(
                        {
                            "type": "websocket.send",
                            "text": _error_frame(
                                "send JSON text frames, not binary", WSErrorCode.INVALID_JSON
                            ),
                        }
                    )
                    continue
                if not text.lstrip().startswith("{"):
                    try:
                        value = json.loads(text)
                    except ValueError:
                        return message  # OpenEnv answers INVALID_JSON itself
                    problem = f"a message must be a JSON object, got {type(value).__name__}"
                    await send(
                        {
                            "type": "websocket.send",
                            "text": _error_frame(problem, WSErrorCode.VALIDATION_ERROR),
                        }
                    )
                    continue
                return message

        return guarded


class SharedSessionServer(HTTPEnvServer):
    """OpenEnv's server, whose sessions count in their client's share however they were opened.

    OpenEnv opens a session for each WebSocket on ``/ws`` and ``/mcp`` and for each HTTP ``POST /mcp``
    ``openenv/session/create`` (which then lives on until ``openenv/session/close`` or its idle timeout, and
    any call renews it), all through one method; here that method first counts the client's open sessions,
    however opened, and refuses one past ``share`` as OpenEnv refuses a full server (a WebSocket gets a
    ``CAPACITY_REACHED`` error frame, HTTP MCP a JSON-RPC server error). A WebSocket attached to an HTTP
    session (``/ws?session_id=``) opens none. The client is the host of the connection or request
    (:data:`~progpo_envs.server.openenv_session.CLIENT_ADDRESS`, set by :class:`SessionGuard`).

    Args:
        share: Open sessions one client may hold.
        args, kwargs: OpenEnv's :class:`~openenv.core.env_server.http_server.HTTPEnvServer`'s.
    """

    def __init__(self, *args: Any, share: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.share = share
        self._session_clients: dict[str, str] = {}  # session id -> client, pruned as sessions end
        self._opening: Counter[str] = Counter()  # sessions being built, per client

    def sessions_of(self, client: str) -> int:
        """Open sessions of ``client`` (those being opened included)."""
        live = self._sessions
        self._session_clients = {sid: who for sid, who in self._session_clients.items() if sid in live}
        return sum(who == client for who in self._session_clients.values()) + self._opening[client]

    async def _create_session(self) -> tuple[str, Any]:
        client = CLIENT_ADDRESS.get() or ""
        held = self.sessions_of(client)  # no await between the count and the reservation: one event loop
        if held >= self.share:
            raise SessionCapacityError(
                active_sessions=len(self._sessions),
                max_sessions=self.max_concurrent_envs,
                message=f"this client holds {held} open sessions, its share of the server; "
                "close some or retry later",
            )
        self._opening[client] += 1
        try:
            session_id, env = await super()._create_session()
        finally:
            self._opening[client] -= 1
            if not self._opening[client]:
                del self._opening[client]
        self._session_clients[session_id] = client
        return session_id, env


def create_openenv_app(
    config: ServerConfig, pool: EnvPool | None = None, threads: int = DEFAULT_THREADS
) -> FastAPI:
    """OpenEnv's app for the one env of ``config`` (starts the env workers unless a ``pool`` is given).

    Args:
        config: What to host (exactly one env id) and the pool's sizes and timeouts.
        pool: An existing pool (tests share one); otherwise one is started and stopped at exit.
        threads: Threads that wait on the env workers for the sessions (the event loop never blocks).
    """
    if len(config.env_ids) != 1:
        raise ValueError(f"the OpenEnv protocol serves one env per port, got {len(config.env_ids)}")
    env_id = config.env_ids[0]
    if pool is None:
        pool = EnvPool(config.policies(), config.pool)
        atexit.register(pool.shutdown)
    policy = pool.policies[env_id]
    statements = env_statements(policy.entry_point)  # the env class's own metadata, never its id
    host = SessionHost(
        pool=pool,
        env_id=env_id,
        executor=ThreadPoolExecutor(max_workers=threads, thread_name_prefix="openenv-session"),
        metadata=environment_metadata(
            env_id,
            listed_splits(policy.entry_point, policy.fixed_kwargs),
            tuple(statements.get("task_types", ())),
            policy.fixed_kwargs.get("split") if "split" in policy.fixed_kwargs else None,
        ),
        observation_cls=observation_class(statements),
    )
    idle = pool.config.idle_timeout
    server = SharedSessionServer(
        functools.partial(PoolSession, host),
        CommandAction,
        host.observation_cls,
        share=pool.config.client_share,
        env_name=env_id.split("/")[-1],
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=pool.config.max_instances,
            session_timeout=None if math.isinf(idle) else idle,
        ),
        state_cls=TextEnvState,
    )
    # the app OpenEnv's create_app builds, with this server: OpenEnv's HTTP API 1.0.0 (the version
    # `openenv validate --url` reads), its routes and their documentation
    app = FastAPI(
        title="OpenEnv Environment HTTP API",
        version="1.0.0",
        description=f"{env_id} served by `progpo serve --protocol openenv`: {host.metadata.description}",
        docs_url="/docs",
        redoc_url="/redoc",
        openapi_url="/openapi.json",
    )
    server.register_routes(app, mode=os.environ.get("OPENENV_MODE", ServerMode.SIMULATION.value))

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(PolicyError)
    async def _policy_error(request: Request, exc: PolicyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    app.add_middleware(SessionGuard)
    app.state.progpo_pool = pool
    app.state.openenv_server = server
    return app


class OpenEnvServer:
    """``app`` served by uvicorn on a thread of this process, on ``host:port`` (``port=0``: a free one).

    Args:
        app: The app (:func:`create_openenv_app`).
        host: Address to bind.
        port: Port to bind (0: any free port; read :attr:`port`).
        drain_timeout: Seconds the open connections get to finish when the server stops.
        shutdown_pool: Also stop the app's env workers when the server stops.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_timeout: float = DRAIN_TIMEOUT,
        shutdown_pool: bool = True,
    ):
        self.app = app
        self.shutdown_pool = shutdown_pool
        self._socket = socket.create_server((host, port), reuse_port=False)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            app,
            log_level="warning",
            ws_max_size=MAX_REQUEST_BYTES,
            timeout_graceful_shutdown=drain_timeout,
            lifespan="on",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, args=([self._socket],), name="openenv-server"
        )

    def start(self) -> OpenEnvServer:
        """Start serving; returns once the server accepts connections."""
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the OpenEnv server stopped while starting")
            self._thread.join(0.02)
        return self

    def __enter__(self) -> OpenEnvServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the server stops (or ``timeout`` seconds)."""
        self._thread.join(timeout)

    def stop(self) -> None:
        """Stop accepting, let the open connections finish (``drain_timeout``), then stop the env workers."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()
        pool = getattr(self.app.state, "progpo_pool", None)
        if self.shutdown_pool and pool is not None:
            pool.shutdown()


def serve_until_stopped(server: OpenEnvServer) -> None:
    """Run ``server`` until SIGTERM or SIGINT, then drain and stop it (see :meth:`OpenEnvServer.stop`)."""
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        while server.running and not stopping.wait(0.25):
            pass
        print("[env-server] stopping: finishing the sessions in flight", file=sys.stderr, flush=True)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        server.stop()
