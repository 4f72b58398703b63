"""The env server: a Flask app hosting registered ``progpo/*`` text envs over JSON/HTTP.

Routes (every body and answer is JSON; values inside ``info``/``options`` use
:mod:`progpo_envs.server.codec`):

* ``GET /health`` — the process answers (liveness); ``GET /ready`` — every env worker is up (503 otherwise);
* ``GET /metrics`` — live instances, steps/resets served, errors by status, each worker's memory;
* ``GET /envs`` — hosted env ids and the kwargs a client may set;
* ``POST /instances`` ``{env_id, kwargs?, seed?, options?}`` → 201 ``{instance_id, num_tasks, ...}`` (with
  ``seed`` or ``options`` the instance is also reset);
* ``GET /instances/<id>`` (last ``{observation, info}``), ``.../observation``, ``.../available_actions``;
* ``POST /instances/<id>/reset`` ``{seed?, options?, seq?}`` → ``{observation, info}``;
* ``POST /instances/<id>/step`` ``{action, seq?}`` → ``{observation, reward, terminated, truncated, info}``;
* ``DELETE /instances/<id>`` — close;
* ``POST /batch/step`` ``{steps: [{instance_id, action, seq?}, ...]}`` → ``{results: [...]}``, and
  ``POST /batch/reset`` ``{resets: [{instance_id, seed?, options?, seq?}, ...]}``.

A batch answers one result per item, each ``{"ok": true, ...}`` or ``{"ok": false, "status", "error"}``, so
one lost instance does not fail the others. Errors are ``{"error": message}`` with a 4xx status for anything
the client can fix (400 malformed, 404 unknown instance or route, 409 out of order / not reset, 410 instance
lost with its worker, 413 too large, 429 instance limit) and 503/504 when the server cannot answer now.
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
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from progpo_envs.server.codec import CodecError, decode, encode
from progpo_envs.server.policy import EnvPolicy, PolicyError
from progpo_envs.server.pool import EnvPool, PoolConfig, ServerError

#: Largest request body (bytes): an action is at most a few KiB, a batch a few thousand of them.
MAX_REQUEST_BYTES = 8 << 20
#: Most items in one batch request.
MAX_BATCH = 4096
_MAX_SEED = 2**64


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
    """

    env_ids: tuple[str, ...] = ("progpo/ALFWorld-v0",)
    env_kwargs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    allowed_kwargs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    pool: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    agentgym: str | None = None

    def policies(self) -> dict[str, EnvPolicy]:
        """The allow-list policy of each hosted env."""
        return {
            env_id: EnvPolicy.from_registry(
                env_id, self.env_kwargs.get(env_id), self.allowed_kwargs.get(env_id)
            )
            for env_id in self.env_ids
        }


def json_body() -> dict[str, Any]:
    """The request's JSON object (empty for an empty body); 400 for anything else."""
    if not request.get_data(cache=True):
        return {}
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ServerError(400, "the request body must be a JSON object")
    return body


def _seed(body: Mapping[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _MAX_SEED:
        raise ServerError(400, "seed must be null or an integer in [0, 2**64)")
    return seed


def _options(body: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = body.get("options")
    if raw is None:
        return None
    try:
        options = decode(raw)
    except CodecError as exc:
        raise ServerError(400, f"options: {exc}") from None
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ServerError(400, "options must be a JSON object")
    return options


def _seq(body: Mapping[str, Any]) -> int | None:
    seq = body.get("seq")
    if seq is None:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63:
        raise ServerError(400, "seq must be null or a positive integer")
    return seq


def _action(body: Mapping[str, Any]) -> str | None:
    if "action" not in body:
        raise ServerError(400, "missing 'action'")
    action = body["action"]
    if action is not None and not isinstance(action, str):
        raise ServerError(400, "action must be a string (or null for a non-text action, an invalid action)")
    return action


def reset_args(body: Mapping[str, Any]) -> dict[str, Any]:
    """Validated arguments of a reset."""
    return {"seed": _seed(body), "options": _options(body), "seq": _seq(body)}


def step_args(body: Mapping[str, Any]) -> dict[str, Any]:
    """Validated arguments of a step."""
    return {"action": _action(body), "seq": _seq(body)}


def available_actions(info: Mapping[str, Any]) -> Any:
    """The env's list of actions from its info (``admissible_actions`` or ``available_actions``)."""
    for key in ("admissible_actions", "available_actions"):
        if key in info:
            return info[key]
    return None


def _batch_items(body: Mapping[str, Any], key: str) -> list[Any]:
    items = body.get(key)
    if not isinstance(items, list):
        raise ServerError(400, f"'{key}' must be a list")
    if len(items) > MAX_BATCH:
        raise ServerError(413, f"at most {MAX_BATCH} items per batch")
    return items


def _batch_result(reply: tuple) -> dict[str, Any]:
    if reply[0] == "ok":
        return {"ok": True, **reply[1]}
    return {"ok": False, "status": reply[1], "error": reply[2]}


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
    stats: Counter = Counter()
    stats_lock = threading.Lock()

    def count(key: str) -> None:
        with stats_lock:
            stats[key] += 1

    def error(status: int, message: str) -> tuple[Response, int]:
        count(f"errors_{status}")
        return jsonify(error=message), status

    @app.errorhandler(ServerError)
    def _server_error(exc: ServerError):
        return error(exc.status, exc.message)

    @app.errorhandler(PolicyError)
    def _policy_error(exc: PolicyError):
        return error(400, str(exc))

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        return error(exc.code or 400, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):  # a bug in the server itself: answer, log, keep serving
        app.logger.exception("unexpected error")
        if isinstance(exc, RuntimeError) and "env worker" in str(exc):
            return error(503, f"an env worker could not be (re)started: {str(exc).splitlines()[0]}")
        return error(500, f"internal error: {type(exc).__name__}")

    @app.before_request
    def _count_request():
        count("requests")

    @app.get("/health")
    def health():
        return jsonify(status="ok")

    @app.get("/ready")
    def ready():
        if pool.ready:
            return jsonify(ready=True)
        return jsonify(ready=False, error="env workers are starting"), 503

    @app.get("/metrics")
    def metrics():
        with stats_lock:
            http = dict(stats)
        return jsonify(**pool.metrics(), http=http)

    @app.get("/envs")
    def envs():
        return jsonify(
            {env_id: {"allowed_kwargs": sorted(p.allowed_kwargs)} for env_id, p in pool.policies.items()}
        )

    @app.post("/instances")
    def create_instance():
        body = json_body()
        try:
            kwargs = decode(body.get("kwargs"))
        except CodecError as exc:
            raise ServerError(400, f"kwargs: {exc}") from None
        instance_id, meta = pool.create(body.get("env_id"), kwargs)
        answer: dict[str, Any] = {"instance_id": instance_id, **meta}
        if "seed" in body or "options" in body:
            try:
                answer.update(
                    pool.call(instance_id, "reset", {"seed": _seed(body), "options": _options(body)})
                )
            except ServerError:
                pool.close_instance(instance_id)
                raise
        return jsonify(answer), 201

    @app.get("/instances/<instance_id>")
    def last_step(instance_id: str):
        return jsonify(pool.call(instance_id, "get", {}))

    @app.get("/instances/<instance_id>/observation")
    def observation(instance_id: str):
        return jsonify(observation=pool.call(instance_id, "get", {})["observation"])

    @app.get("/instances/<instance_id>/available_actions")
    def actions(instance_id: str):
        info = decode(pool.call(instance_id, "get", {})["info"])
        return jsonify(available_actions=encode(available_actions(info)))

    @app.post("/instances/<instance_id>/reset")
    def reset(instance_id: str):
        return jsonify(pool.call(instance_id, "reset", reset_args(json_body())))

    @app.post("/instances/<instance_id>/step")
    def step(instance_id: str):
        return jsonify(pool.call(instance_id, "step", step_args(json_body())))

    @app.delete("/instances/<instance_id>")
    def close(instance_id: str):
        pool.close_instance(instance_id)
        return jsonify(closed=True)

    def run_batch(op: str, key: str, parse) -> Response:
        items, parsed = _batch_items(json_body(), key), []
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise ServerError(400, f"{key}[{position}] must be a JSON object")
            try:
                parsed.append({"instance_id": item.get("instance_id"), **parse(item)})
            except ServerError as exc:
                raise ServerError(exc.status, f"{key}[{position}]: {exc.message}") from None
        return jsonify(results=[_batch_result(reply) for reply in pool.batch(op, parsed)])

    @app.post("/batch/step")
    def batch_step():
        return run_batch("step", "steps", step_args)

    @app.post("/batch/reset")
    def batch_reset():
        return run_batch("reset", "resets", reset_args)

    if config.agentgym is not None:
        from progpo_envs.server.agentgym import agentgym_blueprint

        app.register_blueprint(agentgym_blueprint(pool, config.agentgym))
    return app
