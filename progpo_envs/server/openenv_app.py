"""A hosted env as an OpenEnv environment: OpenEnv's own server on our env pool.

``progpo serve --protocol openenv --env progpo/ALFWorld-v0 --port P`` serves OpenEnv's routes at the root of
the port, built by ``openenv``'s :func:`~openenv.core.env_server.http_server.create_app` (not a copy of its
protocol): the stateful WebSocket session ``/ws`` (``reset``, ``step``, ``state``, ``close`` messages and
OpenEnv's typed errors), the stateless HTTP ``/reset`` and ``/step``, ``/state``, ``/health``, ``/schema``,
``/metadata``, ``/mcp`` and ``/docs``. OpenEnv's own ``GenericEnvClient(base_url="http://127.0.0.1:P")``
plays episodes unchanged; the models are :mod:`~progpo_envs.server.openenv_models`, the sessions
:class:`~progpo_envs.server.openenv_session.PoolSession` (the episodes run in the env pool's workers).

What this module adds around OpenEnv's app (:class:`SessionGuard`, an ASGI middleware; exception handlers):

* concurrency: OpenEnv's session limit is the pool's instance limit (``--max-instances``, 1024 by default, so
  a trainer's group × batch fits; OpenEnv's own default is one session), and one client address holds at
  most the pool's per-client share of open sessions (``--max-instances-per-client``, half by default): one
  more is answered as OpenEnv answers a full server, a ``CAPACITY_REACHED`` error frame, then the close;
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
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.types import ConcurrencyConfig, WSErrorCode, WSErrorResponse

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

#: WebSocket routes of OpenEnv's app that open a session (each counts against a client's share).
SESSION_ROUTES = frozenset({"/ws", "/mcp", "/harness"})


def _error_frame(message: str, code: WSErrorCode) -> str:
    return WSErrorResponse(data={"message": message, "code": code}).model_dump_json()


class SessionGuard:
    """ASGI middleware of the OpenEnv app: the client's address, its share of sessions, frames kept in line.

    Args:
        app: OpenEnv's app.
        share: Open sessions one client (host) may hold.
    """

    def __init__(self, app: Any, share: int):
        self.app = app
        self.share = share
        self.open_sessions: Counter[str] = Counter()  # touched only on the event loop's thread

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        # the client is its host, as on the native routes (webshop_server.clients): several loopback
        # addresses of one machine are one client (tokens name clients on the native routes only)
        address = client_host(scope["client"][0]) if scope.get("client") else None
        token = CLIENT_ADDRESS.set(address)
        try:
            if scope["type"] == "websocket" and scope.get("path") in SESSION_ROUTES:
                await self._session(scope, receive, send, address)
            else:
                await self.app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    async def _session(self, scope: dict, receive: Callable, send: Callable, address: str | None) -> None:
        key = address or ""
        if self.open_sessions[key] >= self.share:
            # as OpenEnv refuses a session on a full server: accept, one typed error frame, close
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.accept"})
                message = (
                    f"this client holds {self.open_sessions[key]} open sessions, its share of the server; "
                    "close some or retry later"
                )
                await send(
                    {"type": "websocket.send", "text": _error_frame(message, WSErrorCode.CAPACITY_REACHED)}
                )
                await send({"type": "websocket.close", "code": 1000})
            return
        self.open_sessions[key] += 1
        try:
            await self.app(scope, self._frames(receive, send) if scope["path"] == "/ws" else receive, send)
        finally:
            self.open_sessions[key] -= 1
            if not self.open_sessions[key]:
                del self.open_sessions[key]

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
    app = create_app(
        functools.partial(PoolSession, host),
        CommandAction,
        host.observation_cls,
        env_name=env_id.split("/")[-1],
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=pool.config.max_instances,
            session_timeout=None if math.isinf(idle) else idle,
        ),
        state_cls=TextEnvState,
    )

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(PolicyError)
    async def _policy_error(request: Request, exc: PolicyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    app.add_middleware(SessionGuard, share=pool.config.client_share)
    app.state.progpo_pool = pool
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
