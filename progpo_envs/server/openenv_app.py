"""A hosted env as an OpenEnv environment: OpenEnv's own server on our env pool.

``progpo serve --protocol openenv --env progpo/ALFWorld-v0 --port P`` serves OpenEnv's routes at the root of
the port, from ``openenv``'s own server (:class:`~openenv.core.env_server.http_server.HTTPEnvServer` and its
routes, on the app its ``create_app`` would build; not a copy of its protocol): the stateful WebSocket session
``/ws`` (``reset``, ``step``, ``state``, ``close`` messages and OpenEnv's typed errors), the stateless HTTP
``/reset`` and ``/step``, ``/state``, ``/health``, ``/schema``, ``/metadata``, ``/mcp`` and ``/docs``; and one
of ours, ``GET /expert?episode_id=``: the expert's next command in that session, where the operator turned
the expert on (no observation carries it: a policy shown whole observations never sees the answer).
OpenEnv's own ``GenericEnvClient(base_url="http://127.0.0.1:P")`` plays episodes unchanged; the models are
:mod:`~progpo_envs.server.openenv_models`, the sessions
:class:`~progpo_envs.server.openenv_session.PoolSession` (the episodes run in the env pool's workers).

What this module adds around OpenEnv's server (:class:`SharedSessionServer`, :class:`SessionGuard`, an ASGI
middleware, and exception handlers), doing what the native routes do wherever OpenEnv does otherwise:

* concurrency: OpenEnv's session limit is the pool's instance limit (``--max-instances``, 1024 by default, so
  a trainer's group × batch fits; OpenEnv's own default is one session), and one client (its host) holds at
  most the pool's per-client share of open sessions (``--max-instances-per-client``, half by default),
  however it opened them: a WebSocket on ``/ws`` or ``/mcp``, or HTTP ``POST /mcp``
  ``openenv/session/create``; one more is answered as OpenEnv answers a full server (a ``CAPACITY_REACHED``
  error frame, a JSON-RPC server error);
* idle expiry: a session idle for ``--idle-timeout`` seconds is ended by OpenEnv's reaper and its instance by
  the pool's, so an abandoned connection frees its slot;
* bounded reading: every HTTP body and WebSocket message is read within the native routes' bounds (size,
  JSON values, nesting, integer digits, no lone surrogate; :data:`MESSAGE_BOUNDS`) before OpenEnv sees it; a
  message past them, a binary frame or JSON that is not an object is answered with a typed error frame
  (``INVALID_JSON``, ``VALIDATION_ERROR``) and the session reads on, where OpenEnv's loop would end it;
* errors of the HTTP routes are 4xx answers with a message, never a 5xx (OpenEnv's error answers that echo a
  value JSON cannot hold would be 500s);
* connections: :class:`OpenEnvServer` serves with the native servers' per-host connection shares, deadlines,
  open-file limit and quiet logs (:mod:`~progpo_envs.server.uvicorn_serving`).

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

import asyncio
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
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcResponse
from openenv.core.env_server.types import ConcurrencyConfig, ServerMode, WSErrorCode, WSErrorResponse

from progpo_base.http import RequestError, json_object, json_value
from progpo_envs.core.registration import env_statements, listed_splits
from progpo_envs.server.app import ServerConfig
from progpo_envs.server.openenv_models import CommandAction, TextEnvState, observation_class
from progpo_envs.server.openenv_session import (
    CLIENT_ADDRESS,
    PoolSession,
    SessionError,
    SessionHost,
    check_reset_types,
    environment_metadata,
)
from progpo_envs.server.policy import PolicyError
from progpo_envs.server.pool import EnvPool
from progpo_envs.server.request_args import MAX_INT_DIGITS, MAX_JSON_DEPTH, MAX_JSON_VALUES, MAX_REQUEST_BYTES
from progpo_envs.server.serving import DEFAULT_THREADS
from progpo_envs.server.uvicorn_serving import FairShareProtocol, uvicorn_config
from webshop_server.clients import client_host
from webshop_server.serving import DRAIN_TIMEOUT, READ_TIMEOUT

#: WebSocket routes whose messages the guard reads first (OpenEnv's session and its MCP session).
GUARDED_ROUTES = frozenset({"/ws", "/mcp"})
#: Longest WebSocket message the guard reads (a reset or a step is a few KiB): a longer one is answered with a
#: typed error, and one past :data:`MAX_REQUEST_BYTES` closes its connection (uvicorn's frame limit, 1009).
MAX_MESSAGE_CHARS = 1 << 20
#: HTTP methods whose body the guard reads, bounded, before OpenEnv's routes see it.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: The bounds of every body and message on this door: those of the native routes
#: (:mod:`~progpo_envs.server.request_args`), and their nesting and integers too.
MESSAGE_BOUNDS: dict[str, Any] = {
    "max_depth": MAX_JSON_DEPTH,
    "max_int_digits": MAX_INT_DIGITS,
    "text_only": True,  # an answer that echoes a lone surrogate could not be written as UTF-8
}


def _error_frame(message: str, code: WSErrorCode) -> str:
    return WSErrorResponse(data={"message": message, "code": code}).model_dump_json()


def _rpc_error_frame(message: str, code: JsonRpcErrorCode) -> str:
    return JsonRpcResponse.error_response(code, message).model_dump_json()


def _refusal(exc: RequestError, path: str) -> str:
    """A message the guard refuses, as the route's own typed error: an OpenEnv error frame on ``/ws`` (text
    that is not JSON ``INVALID_JSON``, JSON past the bounds or not an object ``VALIDATION_ERROR``), a JSON-RPC
    error on ``/mcp`` (``PARSE_ERROR``, ``INVALID_REQUEST``)."""
    syntax = exc.status == 400 and "must be a JSON object" not in exc.message
    if path == "/mcp":
        return _rpc_error_frame(
            exc.message, JsonRpcErrorCode.PARSE_ERROR if syntax else JsonRpcErrorCode.INVALID_REQUEST
        )
    return _error_frame(exc.message, WSErrorCode.INVALID_JSON if syntax else WSErrorCode.VALIDATION_ERROR)


def read_message(text: str | None, what: str = "the message") -> dict[str, Any]:
    """A WebSocket message as a JSON object within :data:`MESSAGE_BOUNDS` (:class:`RequestError` 400 for
    text that is not JSON or a binary frame, 413 past :data:`MAX_MESSAGE_CHARS` or the most JSON values, 422
    past the nesting, the integer digits or for a lone surrogate; 400 for JSON that is not an object)."""
    if text is None:
        raise RequestError(400, "send JSON text frames, not binary")
    if len(text) > MAX_MESSAGE_CHARS:
        raise RequestError(413, f"{what} is longer than {MAX_MESSAGE_CHARS} characters")
    message = json_value(text, MAX_JSON_VALUES, what=what, **MESSAGE_BOUNDS)
    if not isinstance(message, dict):
        raise RequestError(400, f"{what} must be a JSON object, got {type(message).__name__}")
    return message


async def _answer(send: Callable, status: int, payload: Any) -> None:
    body = json.dumps(payload, ensure_ascii=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _ClientGone(Exception):
    """The client hung up while its request body was being read."""


class SessionGuard:
    """ASGI middleware of the OpenEnv app: the client's host, bounded bodies and messages, 4xx answers.

    * every request and connection runs with its client's host in
      :data:`~progpo_envs.server.openenv_session.CLIENT_ADDRESS` (the sessions' and instances' shares);
    * an HTTP body is read first, with the native routes' bounds: at most :data:`MAX_REQUEST_BYTES` (413),
      each part within :data:`~webshop_server.serving.READ_TIMEOUT` seconds (408), a JSON object within
      :data:`MESSAGE_BOUNDS` (400, 413, 422: ``NaN``, ``Infinity``, 5,000-digit integers, deep nesting and
      lone surrogates never reach OpenEnv's models, whose error answers could not be written);
      ``/reset``'s ``seed``, ``task_index`` and ``episode_id`` are checked as sent
      (:func:`~progpo_envs.server.openenv_session.check_reset_types`);
    * a WebSocket message on ``/ws`` or ``/mcp`` is read the same way (:func:`read_message`); one it refuses
      is answered with the route's typed error and the connection reads on (OpenEnv's loop would end the
      session on a binary frame, JSON that is not an object, a 5,000-digit integer or deep nesting).

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
            if scope["type"] == "websocket":
                if scope.get("path") in GUARDED_ROUTES:
                    receive = self._frames(receive, send, scope["path"])
                await self.app(scope, receive, send)
            elif scope.get("method") in BODY_METHODS:
                await self._http(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    async def _http(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path")
        try:
            raw = await self._body(receive)
            body = json_object(raw, MAX_JSON_VALUES, **MESSAGE_BOUNDS)
            if path == "/reset":
                check_reset_types(body)
        except _ClientGone:
            return
        except (RequestError, SessionError) as exc:
            if path == "/mcp":
                await _answer(send, exc.status, json.loads(_refusal(exc, path)))
            else:
                await _answer(send, exc.status, {"detail": exc.message})
            return
        await self.app(scope, self._replay(raw, receive), send)

    @staticmethod
    async def _body(receive: Callable) -> bytes:
        parts, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), READ_TIMEOUT)
            except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
                raise RequestError(408, f"the request body stalled for {READ_TIMEOUT:g} s") from None
            if message["type"] == "http.disconnect":
                raise _ClientGone
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > MAX_REQUEST_BYTES:
                raise RequestError(413, f"the request body is larger than {MAX_REQUEST_BYTES} bytes")
            if not message.get("more_body", False):
                return b"".join(parts)

    @staticmethod
    def _replay(raw: bytes, receive: Callable) -> Callable:
        """``receive`` that hands the app the body already read, then what the connection sends next."""
        pending = [{"type": "http.request", "body": raw, "more_body": False}]

        async def replay() -> dict:
            return pending.pop() if pending else await receive()

        return replay

    @staticmethod
    def _frames(receive: Callable, send: Callable, path: str) -> Callable:
        """``receive`` that answers the messages :func:`read_message` refuses, and reads on.

        OpenEnv's loops only receive while they are not sending, so an error sent here never interleaves
        with one of their answers.
        """

        async def guarded() -> dict:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                try:
                    read_message(message.get("text"))
                except RequestError as exc:
                    await send({"type": "websocket.send", "text": _refusal(exc, path)})
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

    def session_of_episode(self, episode_id: str) -> PoolSession:
        """The open session playing ``episode_id`` (:class:`SessionError` 404 for none, 409 when several
        sessions chose the same id)."""
        found = [
            env
            for env in list(self._sessions.values())
            if isinstance(env, PoolSession) and env.state.episode_id == episode_id
        ]
        if not found:
            raise SessionError(404, f"no open session plays episode {episode_id[:80]!r}")
        if len(found) > 1:
            raise SessionError(
                409, f"{len(found)} open sessions play episode {episode_id[:80]!r}: give each its own"
            )
        return found[0]


def _json_safe(value: Any) -> Any:
    """``value`` with what JSON cannot hold spelled as text (a non-finite float, a lone surrogate), so an
    error answer that echoes a client's input can always be written."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


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

    @app.get("/expert")
    async def expert(episode_id: str) -> dict[str, Any]:
        """The expert's next command in the open session playing ``episode_id`` (its ``state``'s; a reset
        may name it): where the operator turned the expert on. No observation carries it, so a policy
        shown whole observations never sees the answer; an SFT warm start or a scripted expert asks here."""
        session = server.session_of_episode(episode_id)
        return {"episode_id": episode_id, "expert_action": await session.expert_action_async()}

    @app.exception_handler(SessionError)
    async def _session_error(request: Request, exc: SessionError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(PolicyError)
    async def _policy_error(request: Request, exc: PolicyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail = _json_safe(jsonable_encoder(exc.detail))
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    app.add_middleware(SessionGuard)
    app.state.progpo_pool = pool
    app.state.openenv_server = server
    return app


class OpenEnvServer:
    """``app`` served by uvicorn on a thread of this process, on ``host:port`` (``port=0``: a free one), with
    the native servers' connection rules (:func:`~progpo_envs.server.uvicorn_serving.uvicorn_config`).

    Args:
        app: The app (:func:`create_openenv_app`).
        host: Address to bind.
        port: Port to bind (0: any free port; read :attr:`port`).
        sock: A socket bound already (``progpo serve`` binds it before the env workers start), instead of
            ``host`` and ``port``.
        drain_timeout: Seconds the open connections get to finish when the server stops.
        shutdown_pool: Also stop the app's env workers when the server stops.
        protocol: The HTTP protocol (:func:`~progpo_envs.server.uvicorn_serving.fair_share_protocol`: the
            tests' shorter deadlines).
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_timeout: float = DRAIN_TIMEOUT,
        shutdown_pool: bool = True,
        protocol: type[FairShareProtocol] = FairShareProtocol,
        sock: socket.socket | None = None,
    ):
        self.app = app
        self.shutdown_pool = shutdown_pool
        self._socket = sock if sock is not None else socket.create_server((host, port), reuse_port=False)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        server = getattr(app.state, "openenv_server", None)
        config = uvicorn_config(
            app,
            max_sessions=server.max_concurrent_envs if server is not None else 1,
            ws_max_size=MAX_REQUEST_BYTES,
            drain_timeout=drain_timeout,
            protocol=protocol,
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
