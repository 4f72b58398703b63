"""The env server: a Flask app hosting registered ``progpo/*`` text envs over JSON/HTTP.

Routes (every body and answer is JSON; values inside ``info``/``options`` use
:mod:`progpo_envs.server.codec`):

* ``GET /health`` — the process answers (liveness); ``GET /ready`` — every env worker is up (503 otherwise);
  both name the server (``server_id``, random, made at its start: one server under two URLs shows one id);
* ``GET /metrics`` — live instances, steps/resets served, errors by status, each worker's memory;
* ``GET /envs`` — hosted env ids and the kwargs a client may set;
* ``POST /instances`` ``{env_id, kwargs?, seed?, options?}`` → 201 ``{instance_id, num_tasks, ...}`` (with
  ``seed`` or ``options`` the instance is also reset);
* ``GET /instances/<id>`` (last ``{observation, info}``), ``.../observation``, ``.../available_actions``;
* ``GET /instances/<id>/expert`` — ``{expert_action}``: the expert's next command, where the operator turned
  the expert on; no other answer carries it (:mod:`~progpo_envs.server.pool_worker`);
* ``POST /instances/<id>/reset`` ``{seed?, options?, seq?}`` → ``{observation, info}``;
* ``POST /instances/<id>/step`` ``{action, seq?}`` → ``{observation, reward, terminated, truncated, info}``;
* ``DELETE /instances/<id>`` — close;
* ``POST /batch/step`` ``{steps: [{instance_id, action, seq?}, ...]}`` → ``{results: [...]}``, and
  ``POST /batch/reset`` ``{resets: [{instance_id, seed?, options?, seq?}, ...]}``;
* ``GET /stream`` with ``Upgrade: websocket`` — the stream door: the same calls as WebSocket messages on one
  persistent connection (:mod:`progpo_envs.server.stream`; the route itself answers only a request that is
  not a valid upgrade, or one a server without the door receives).

Each route is one call of :class:`~progpo_envs.server.native.NativeApi`, which the stream door calls too. A
batch answers one result per item, each ``{"ok": true, ...}`` or ``{"ok": false, "status", "error"}``, so
one lost instance does not fail the others; its answer is bounded (:mod:`progpo_envs.server.native`: the
items past :data:`~progpo_envs.server.native.MAX_BATCH_ANSWER_CHARS` answer ``not_run``, 413, and the client
sends them again). Errors are ``{"error": message}`` with a 4xx status for anything
the client can fix (400 malformed, 404 unknown instance or route, 409 out of order / not reset, 410 instance
lost with its worker, 413 too large, 429 instance limit; 401 for an unknown client token) and 503/504 when the
server cannot answer now. Every request counts against its client: its host, or its client token with
``client_tokens`` (:mod:`webshop_server.clients`).
``seq`` makes a retried reset/step return the original answer instead of acting twice (see
:mod:`progpo_envs.server.pool`).

Example:
    >>> app = create_app(ServerConfig(env_ids=("progpo/ALFWorld-v0",)))  # doctest: +SKIP
    >>> client = app.test_client()  # doctest: +SKIP
    >>> client.get("/health").json  # doctest: +SKIP
    {'status': 'ok'}
"""

from __future__ import annotations

import atexit
import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from progpo_base.http import RequestError
from progpo_envs.server.agentgym import AgentGymGames, agentgym_blueprint
from progpo_envs.server.native import NativeApi, ServerStats, error_status
from progpo_envs.server.policy import EnvPolicy, PolicyError
from progpo_envs.server.pool import EnvPool, PoolConfig, ServerError
from progpo_envs.server.request_args import MAX_REQUEST_BYTES, json_body, request_client
from progpo_envs.server.websocket import STREAM_PATH, handshake_problem
from webshop_server.clients import ClientTokens, UnknownClientToken, identify_client


@dataclasses.dataclass
class ServerConfig:
    """What a server hosts and how.

    Attributes:
        env_ids: Registered ``progpo/*`` ids to host.
        env_kwargs: Per env id, kwargs fixed by the operator (clients cannot change them).
        allowed_kwargs: Per env id, kwargs a client may set (default: read from the env's constructor).
        pool: Workers, instance limit, idle expiry and timeouts.
        agentgym: Env id to also serve through AgentGym's protocol at the root (``/create``, ``/step``, ...);
            ``None`` for none.
        agentgym_mappings: The folder of AgentGym's ALFWorld ``mappings_train.json``/``mappings_test.json``:
            AgentGym's ``game`` ids then name its games in the real data (``None``: they index the hosted
            split).
        client_tokens: The operator's client tokens (``--client-tokens``): a request with one counts as that
            token's client, one with an unknown token is a 401; ``None``: every client is its host.
    """

    env_ids: tuple[str, ...] = ("progpo/ALFWorld-v0",)
    env_kwargs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    allowed_kwargs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    pool: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    agentgym: str | None = None
    agentgym_mappings: str | None = None
    client_tokens: ClientTokens | None = None

    def policies(self) -> dict[str, EnvPolicy]:
        """The allow-list policy of each hosted env."""
        return {
            env_id: EnvPolicy.from_registry(
                env_id, self.env_kwargs.get(env_id), self.allowed_kwargs.get(env_id)
            )
            for env_id in self.env_ids
        }


@dataclasses.dataclass(frozen=True)
class NativeServer:
    """What the app's doors share (``app.extensions["progpo_native"]``): the calls, the request counters and
    the client tokens; the stream door (:mod:`progpo_envs.server.stream`) reads it from the app."""

    api: NativeApi
    stats: ServerStats
    client_tokens: ClientTokens | None


def create_app(config: ServerConfig | None = None, pool: EnvPool | None = None) -> Flask:
    """The env server's Flask app (starts the env workers unless a ``pool`` is given).

    Args:
        config: What to host; ``ServerConfig()`` by default.
        pool: An existing pool (tests share one); otherwise one is started from ``config`` and stopped at
        exit.
    """
    config = config or ServerConfig()
    if pool is None:
        pool = EnvPool(config.policies(), config.pool)
        atexit.register(pool.shutdown)
    app = Flask("progpo_envs.server")
    app.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.json.sort_keys = False
    app.extensions["progpo_pool"] = pool
    api, stats = NativeApi(pool), ServerStats()
    app.extensions["progpo_native"] = NativeServer(api, stats, config.client_tokens)

    def error(status: int, message: str) -> tuple[Response, int]:
        stats.count(f"errors_{status}")
        return jsonify(error=message), status

    def answer(body: bytes, status: int = 200) -> Response:
        return app.response_class(body, status=status, mimetype="application/json")

    @app.errorhandler(RequestError)  # a request body that is not a JSON object (progpo_base.http)
    @app.errorhandler(ServerError)
    @app.errorhandler(PolicyError)
    def _client_error(exc: ServerError | RequestError | PolicyError):
        return error(*error_status(exc))

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        return error(exc.code or 400, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):  # a bug in the server itself: answer, log, keep serving
        known = error_status(exc)
        if known is not None:  # an env worker that could not be (re)started: 503
            return error(*known)
        app.logger.exception("unexpected error")
        return error(500, f"internal error: {type(exc).__name__}")

    @app.before_request
    def _count_request():
        stats.count("requests")
        try:
            g.client = identify_client(
                config.client_tokens, request.headers.get("Authorization"), request.remote_addr
            )
        except UnknownClientToken as exc:
            raise ServerError(401, str(exc)) from None

    # who this server is, made at its start: a client given one server under two names (127.0.0.1 and
    # localhost, two proxies) sees one id twice (progpo_envs.server.fleet refuses it)
    server_id = secrets.token_hex(8)

    @app.get("/health")
    def health():
        return jsonify(status="ok", server_id=server_id)

    @app.get("/ready")
    def ready():
        if pool.ready:
            return jsonify(ready=True, server_id=server_id)
        return jsonify(ready=False, error="env workers are starting", server_id=server_id), 503

    @app.get("/metrics")
    def metrics():
        return jsonify(**pool.metrics(), http=stats.snapshot())

    @app.get("/envs")
    def envs():
        return jsonify(
            {env_id: {"allowed_kwargs": sorted(p.allowed_kwargs)} for env_id, p in pool.policies.items()}
        )

    @app.post("/instances")
    def create_instance():
        return answer(api.create(json_body(), request_client()), 201)

    @app.get("/instances/<instance_id>")
    def last_step(instance_id: str):
        return answer(api.get(instance_id))

    @app.get("/instances/<instance_id>/observation")
    def observation(instance_id: str):
        return answer(api.observation(instance_id))

    @app.get("/instances/<instance_id>/available_actions")
    def actions(instance_id: str):
        return answer(api.available_actions(instance_id))

    @app.get("/instances/<instance_id>/expert")
    def expert(instance_id: str):
        return answer(api.expert(instance_id))

    @app.post("/instances/<instance_id>/reset")
    def reset(instance_id: str):
        return answer(api.reset(instance_id, json_body()))

    @app.post("/instances/<instance_id>/step")
    def step(instance_id: str):
        return answer(api.step(instance_id, json_body()))

    @app.delete("/instances/<instance_id>")
    def close(instance_id: str):
        return answer(api.close(instance_id))

    @app.post("/batch/step")
    def batch_step():
        return answer(api.batch_step(json_body()))

    @app.post("/batch/reset")
    def batch_reset():
        return answer(api.batch_reset(json_body()))

    @app.get(STREAM_PATH)
    @app.route(STREAM_PATH, websocket=True)  # werkzeug routes an upgrade request to websocket rules only
    def stream():
        # a valid upgrade never gets here on `progpo serve`: its channels take the connection over first
        problem = handshake_problem(request.headers.get)
        if problem is not None:
            return error(*problem)
        if request.method != "GET":  # HEAD: Flask answers it with the GET route, the door does not
            return error(405, f"the stream door is opened with GET {STREAM_PATH} (Upgrade: websocket)")
        return error(
            501,
            "this server does not serve the stream door (it needs progpo serve's waitress server); use the "
            "HTTP routes",
        )

    if config.agentgym is not None:
        games = None
        if config.agentgym_mappings is not None:
            fixed = pool.policies[config.agentgym].fixed_kwargs
            games = AgentGymGames.for_env(config.agentgym_mappings, fixed)
        app.register_blueprint(agentgym_blueprint(pool, config.agentgym, games))
    return app
