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
one lost instance does not fail the others. A batch's answer is bounded: its items run in chunks of
:data:`BATCH_CHUNK` and once the answer holds :data:`MAX_BATCH_ANSWER_CHARS` characters of observations and
infos (an html-mode page is some 4,000), the items left are not run and answer ``{"ok": false, "status": 413,
"not_run": true}``: nothing happened to them, and the client sends them again (``progpo/Remote-v0`` does).
Errors are ``{"error": message}`` with a 4xx status for anything
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
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from progpo_base.http import RequestError
from progpo_envs.core.worker_protocol import Reply
from progpo_envs.server.agentgym import AgentGymGames, agentgym_blueprint
from progpo_envs.server.codec import decode, encode
from progpo_envs.server.policy import EnvPolicy, PolicyError
from progpo_envs.server.pool import EnvPool, PoolConfig, ServerError
from progpo_envs.server.request_args import (
    MAX_REQUEST_BYTES,
    available_actions,
    json_body,
    options_arg,
    request_client,
    reset_args,
    seed_arg,
    step_args,
)
from webshop_server.clients import ClientTokens, UnknownClientToken, identify_client

#: Most items in one batch request.
MAX_BATCH = 4096
#: Items of a batch run together before the size of its answer is checked.
BATCH_CHUNK = 256
#: Characters of observations and infos after which a batch's remaining items are not run (as large as the
#: largest request: a batch answers at most about what a client may send).
MAX_BATCH_ANSWER_CHARS = MAX_REQUEST_BYTES


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


def _batch_items(body: Mapping[str, Any], key: str) -> list[Any]:
    items = body.get(key)
    if not isinstance(items, list):
        raise ServerError(400, f"'{key}' must be a list")
    if len(items) > MAX_BATCH:
        raise ServerError(413, f"at most {MAX_BATCH} items per batch")
    return items


def _batch_result(reply: Reply) -> dict[str, Any]:
    if reply.ok:
        return {"ok": True, **reply.value}
    return {"ok": False, "status": reply.status, "error": reply.error}


def _text_chars(value: Any, depth: int = 0) -> int:
    """About how many characters ``value`` takes in JSON: its strings' lengths, 8 for any other leaf."""
    if isinstance(value, str):
        return len(value)
    if depth < 8 and isinstance(value, dict):
        return sum(len(k) + _text_chars(v, depth + 1) for k, v in value.items())
    if depth < 8 and isinstance(value, list):
        return sum(_text_chars(v, depth + 1) for v in value)
    return 8


def _not_run(limit: int) -> dict[str, Any]:
    return {
        "ok": False,
        "status": 413,
        "not_run": True,
        "error": f"not run: this batch's answer reached {limit} characters; send this item again",
    }


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

    @app.errorhandler(RequestError)  # a request body that is not a JSON object (progpo_base.http)
    @app.errorhandler(ServerError)
    def _server_error(exc: ServerError | RequestError):
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
        try:
            g.client = identify_client(
                config.client_tokens, request.headers.get("Authorization"), request.remote_addr
            )
        except UnknownClientToken as exc:
            raise ServerError(401, str(exc)) from None

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
        # the kwargs go to the allow-list as sent: their names are checked before any value is decoded
        instance_id, meta = pool.create(body.get("env_id"), body.get("kwargs"), client=request_client())
        answer: dict[str, Any] = {"instance_id": instance_id, **meta}
        if "seed" in body or "options" in body:
            try:
                answer.update(
                    pool.call(instance_id, "reset", {"seed": seed_arg(body), "options": options_arg(body)})
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
        results: list[dict[str, Any]] = []
        chars = 0
        for start in range(0, len(parsed), BATCH_CHUNK):
            if chars >= MAX_BATCH_ANSWER_CHARS:
                results += [_not_run(MAX_BATCH_ANSWER_CHARS)] * (len(parsed) - start)
                break
            for reply in pool.batch(op, parsed[start : start + BATCH_CHUNK]):
                results.append(_batch_result(reply))
                chars += _text_chars(reply.value) if reply.ok else 0
        return jsonify(results=results)

    @app.post("/batch/step")
    def batch_step():
        return run_batch("step", "steps", step_args)

    @app.post("/batch/reset")
    def batch_reset():
        return run_batch("reset", "resets", reset_args)

    if config.agentgym is not None:
        games = None
        if config.agentgym_mappings is not None:
            fixed = pool.policies[config.agentgym].fixed_kwargs
            games = AgentGymGames.for_env(config.agentgym_mappings, fixed)
        app.register_blueprint(agentgym_blueprint(pool, config.agentgym, games))
    return app
