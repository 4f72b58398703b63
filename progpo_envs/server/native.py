"""The native protocol's calls, once for both of its doors: the HTTP routes and the stream door.

:mod:`~progpo_envs.server.app` maps each HTTP route to one :class:`NativeApi` call and
:mod:`~progpo_envs.server.stream` maps each stream message's ``op`` to the same call (:data:`OPS`), so the
two doors validate alike, answer alike and share every limit of the env pool. A call returns its answer as
JSON bytes, the body the HTTP route sends: a reset, step or get answers with the bytes the env worker wrote
(:func:`~progpo_envs.server.pool_worker.answer_bytes`), passed on as they are, and a batch joins its items'
bytes; nothing is decoded and encoded again on the way. A client's mistake raises
:class:`~progpo_envs.server.pool.ServerError`, :class:`~progpo_base.http.RequestError` or
:class:`~progpo_envs.server.policy.PolicyError`; :func:`error_status` gives each its status and message.

A create may carry an ``idempotency_key`` (the client's own random string): the same client's create with
the same key, sent again because its answer was lost with its connection, is answered with the first one's
instance instead of making a second (:class:`CreateKeys`), so every call of the protocol is safe to retry.

A batch's answer is bounded: its items run in chunks of :data:`BATCH_CHUNK` and once the answer holds
:data:`MAX_BATCH_ANSWER_CHARS` bytes, the items left are not run and answer ``{"ok": false, "status": 413,
"not_run": true}``: nothing happened to them, and the client sends them again (``progpo/Remote-v0`` does).

Example:
    >>> api = NativeApi(pool)  # doctest: +SKIP
    >>> api.step(instance_id, {"action": "look", "seq": 2})  # doctest: +SKIP
    b'{"observation":"You are in the middle of a room...","reward":0.0,...}'
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from progpo_base.http import RequestError
from progpo_envs.core.worker_protocol import Reply
from progpo_envs.server.codec import DecodeBudget, decode, encode
from progpo_envs.server.policy import PolicyError
from progpo_envs.server.pool import EnvPool, ServerError
from progpo_envs.server.request_args import (
    MAX_REQUEST_BYTES,
    available_actions,
    options_arg,
    reset_args,
    seed_arg,
    step_args,
)

#: Most items in one batch request.
MAX_BATCH = 4096
#: Items of a batch run together before the size of its answer is checked.
BATCH_CHUNK = 256
#: Bytes of answers after which a batch's remaining items are not run (as large as the largest request: a
#: batch answers at most about what a client may send).
MAX_BATCH_ANSWER_CHARS = MAX_REQUEST_BYTES

#: Seconds a create's idempotency key is remembered: longer than any client waits for the create and its
#: retries (``progpo/Remote-v0``: ``timeout``, 120 s by default).
CREATE_KEY_SECONDS = 600.0
#: Idempotency keys remembered at most (the oldest forgotten first); each holds its create's answer.
MAX_CREATE_KEYS = 16384
#: Characters of an idempotency key at most.
MAX_CREATE_KEY_LENGTH = 128

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def json_bytes(value: Any) -> bytes:
    """``value`` (JSON-safe) as compact ASCII JSON bytes."""
    return _ENCODER.encode(value).encode("ascii")


class ServerStats:
    """The server's request counters (``/metrics``' ``http``): ``requests`` (HTTP requests and stream
    messages: every call, whichever door), ``stream_messages`` and ``stream_connections`` (the stream door's
    share), ``errors_<status>``."""

    def __init__(self):
        self._counts: Counter = Counter()
        self._lock = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def error_status(exc: BaseException) -> tuple[int, str] | None:
    """The status and message a client's mistake (or a server state it can wait out) is answered with;
    ``None`` for an exception that is a bug of the server."""
    if isinstance(exc, (ServerError, RequestError)):
        return exc.status, exc.message
    if isinstance(exc, PolicyError):
        return 400, str(exc)
    if isinstance(exc, RuntimeError) and "env worker" in str(exc):
        return 503, f"an env worker could not be (re)started: {str(exc).splitlines()[0]}"
    return None


def _batch_items(body: Mapping[str, Any], key: str) -> list[Any]:
    items = body.get(key)
    if not isinstance(items, list):
        raise ServerError(400, f"'{key}' must be a list")
    if len(items) > MAX_BATCH:
        raise ServerError(413, f"at most {MAX_BATCH} items per batch")
    return items


def _not_run(limit: int) -> bytes:
    return json_bytes(
        {
            "ok": False,
            "status": 413,
            "not_run": True,
            "error": f"not run: this batch's answer reached {limit} characters; send this item again",
        }
    )


def _batch_result(reply: Reply) -> bytes:
    """One batch item's answer: ``{"ok": true, <the answer's fields>}`` spliced onto the worker's bytes."""
    if reply.ok:
        value = reply.value
        return b'{"ok":true,' + value[1:] if len(value) > 2 else b'{"ok":true}'
    return json_bytes({"ok": False, "status": reply.status, "error": reply.error})


class _Create:
    """One create under an idempotency key: running (``answer`` ``None``) until ``done`` is set."""

    __slots__ = ("answer", "done", "made")

    def __init__(self):
        self.answer: bytes | None = None
        self.done = threading.Event()
        self.made = time.monotonic()


class CreateKeys:
    """The creates of the last :data:`CREATE_KEY_SECONDS` seconds by client and idempotency key (at most
    :data:`MAX_CREATE_KEYS`): a create sent again with its key (its answer lost with its connection, so the
    client cannot know whether it acted) gets the first one's answer, the same instance, never a second one;
    one that comes while the first still runs waits for it. A create that failed leaves no key: sent again,
    it is tried again. Keys are per client, so no client can replay another's."""

    def __init__(self):
        self._creates: OrderedDict[tuple[str | None, str], _Create] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, client: str | None, key: Any, create: Callable[[], bytes]) -> bytes:
        """``create()``'s answer, once per ``(client, key)``; ``key`` ``None``: every time."""
        if key is None:
            return create()
        if not isinstance(key, str) or not 0 < len(key) <= MAX_CREATE_KEY_LENGTH:
            raise ServerError(
                400, f"idempotency_key must be a string of 1 to {MAX_CREATE_KEY_LENGTH} characters"
            )
        while True:
            with self._lock:
                self._forget_old()
                first = self._creates.get((client, key))
                if first is None:
                    mine = self._creates[(client, key)] = _Create()
            if first is None:
                break
            first.done.wait()
            if first.answer is not None:
                return first.answer
        try:
            mine.answer = create()
        finally:
            with self._lock:
                if mine.answer is None and self._creates.get((client, key)) is mine:
                    del self._creates[(client, key)]
            mine.done.set()
        return mine.answer

    def _forget_old(self) -> None:
        """Drop the keys past their time or past the bound, oldest first (``_lock`` held)."""
        oldest = time.monotonic() - CREATE_KEY_SECONDS
        while self._creates:
            create = next(iter(self._creates.values()))
            if create.made >= oldest and len(self._creates) < MAX_CREATE_KEYS:
                break
            self._creates.popitem(last=False)


class NativeApi:
    """The native protocol's calls on an env pool (see the module docstring).

    Args:
        pool: The env pool.
    """

    def __init__(self, pool: EnvPool):
        self.pool = pool
        self.create_keys = CreateKeys()

    def create(
        self, body: Mapping[str, Any], client: str | None, budget: DecodeBudget | None = None
    ) -> bytes:
        """``POST /instances``: ``{env_id, kwargs?, seed?, options?, idempotency_key?}`` → ``{instance_id,
        num_tasks, ...}`` (with ``seed`` or ``options`` the instance is also reset; answered 201). With an
        ``idempotency_key``, the same client's create with that key is answered once (:class:`CreateKeys`)."""
        return self.create_keys.run(
            client, body.get("idempotency_key"), lambda: self._create(body, client, budget)
        )

    def _create(self, body: Mapping[str, Any], client: str | None, budget: DecodeBudget | None) -> bytes:
        # the kwargs go to the allow-list as sent: their names are checked before any value is decoded
        instance_id, meta = self.pool.create(body.get("env_id"), body.get("kwargs"), client=client)
        answer: dict[str, Any] = {"instance_id": instance_id, **meta}
        if "seed" in body or "options" in body:
            try:
                args = {"seed": seed_arg(body), "options": options_arg(body, budget)}
                answer.update(self.pool.call(instance_id, "reset", args))
            except ServerError:
                self.pool.close_instance(instance_id)
                raise
        return json_bytes(answer)

    def get(self, instance_id: Any) -> bytes:
        """``GET /instances/<id>``: the last ``{observation, info}``."""
        return self.pool.call(instance_id, "get", {}, raw=True)

    def observation(self, instance_id: Any) -> bytes:
        """``GET /instances/<id>/observation``: ``{observation}``."""
        return json_bytes({"observation": self.pool.call(instance_id, "get", {})["observation"]})

    def available_actions(self, instance_id: Any) -> bytes:
        """``GET /instances/<id>/available_actions``: ``{available_actions}`` (codec-encoded)."""
        info = decode(self.pool.call(instance_id, "get", {})["info"])
        return json_bytes({"available_actions": encode(available_actions(info))})

    def expert(self, instance_id: Any) -> bytes:
        """``GET /instances/<id>/expert``: ``{expert_action}``, the expert's next command (``null`` once it
        has none), which no other answer carries; 409 when the env has no expert (the operator's choice)."""
        return json_bytes(self.pool.call(instance_id, "expert", {}))

    def reset(self, instance_id: Any, body: Mapping[str, Any], budget: DecodeBudget | None = None) -> bytes:
        """``POST /instances/<id>/reset``: ``{seed?, options?, seq?}`` → ``{observation, info}``."""
        return self.pool.call(instance_id, "reset", reset_args(body, budget), raw=True)

    def step(self, instance_id: Any, body: Mapping[str, Any]) -> bytes:
        """``POST /instances/<id>/step``: ``{action, seq?}`` → ``{observation, reward, terminated, truncated,
        info}``."""
        return self.pool.call(instance_id, "step", step_args(body), raw=True)

    def close(self, instance_id: Any) -> bytes:
        """``DELETE /instances/<id>``: ``{closed: true}``."""
        self.pool.close_instance(instance_id)
        return b'{"closed":true}'

    def batch_step(self, body: Mapping[str, Any], budget: DecodeBudget | None = None) -> bytes:
        """``POST /batch/step``: ``{steps: [{instance_id, action, seq?}, ...]}`` → ``{results: [...]}``."""
        return self._batch("step", "steps", step_args, body, budget)

    def batch_reset(self, body: Mapping[str, Any], budget: DecodeBudget | None = None) -> bytes:
        """``POST /batch/reset``: ``{resets: [{instance_id, seed?, options?, seq?}, ...]}`` →
        ``{results: [...]}``."""
        return self._batch("reset", "resets", reset_args, body, budget)

    def _batch(
        self,
        op: str,
        key: str,
        parse: Callable[[Mapping[str, Any], DecodeBudget | None], dict[str, Any]],
        body: Mapping[str, Any],
        budget: DecodeBudget | None,
    ) -> bytes:
        items, parsed = _batch_items(body, key), []
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise ServerError(400, f"{key}[{position}] must be a JSON object")
            try:
                parsed.append({"instance_id": item.get("instance_id"), **parse(item, budget)})
            except ServerError as exc:
                raise ServerError(exc.status, f"{key}[{position}]: {exc.message}") from None
        results: list[bytes] = []
        chars = 0
        for start in range(0, len(parsed), BATCH_CHUNK):
            if chars >= MAX_BATCH_ANSWER_CHARS:
                results += [_not_run(MAX_BATCH_ANSWER_CHARS)] * (len(parsed) - start)
                break
            for reply in self.pool.batch(op, parsed[start : start + BATCH_CHUNK], raw=True):
                results.append(_batch_result(reply))
                chars += len(reply.value) if reply.ok else 0
        return b'{"results":[' + b",".join(results) + b"]}"


#: The stream door's ops: each names its HTTP route and says whether it takes an ``instance_id`` and a
#: ``body``; ``create`` answers 201 as its route does, the others 200.
OPS: dict[str, tuple[str, bool]] = {
    "create": ("POST /instances", False),
    "get": ("GET /instances/<id>", True),
    "observation": ("GET /instances/<id>/observation", True),
    "available_actions": ("GET /instances/<id>/available_actions", True),
    "expert": ("GET /instances/<id>/expert", True),
    "reset": ("POST /instances/<id>/reset", True),
    "step": ("POST /instances/<id>/step", True),
    "close": ("DELETE /instances/<id>", True),
    "batch_step": ("POST /batch/step", False),
    "batch_reset": ("POST /batch/reset", False),
}


def run_op(
    api: NativeApi,
    op: Any,
    instance_id: Any,
    body: Mapping[str, Any],
    client: str | None,
    budget: DecodeBudget,
) -> tuple[int, bytes]:
    """The status and answer of the stream door's ``op`` (:data:`OPS`); raises as the calls do (an unknown
    op is a 404, as an unknown route is)."""
    if op == "step":  # the hot path first
        return 200, api.step(instance_id, body)
    if op == "reset":
        return 200, api.reset(instance_id, body, budget)
    if op == "batch_step":
        return 200, api.batch_step(body, budget)
    if op == "batch_reset":
        return 200, api.batch_reset(body, budget)
    if op == "create":
        return 201, api.create(body, client, budget)
    if op == "get":
        return 200, api.get(instance_id)
    if op == "observation":
        return 200, api.observation(instance_id)
    if op == "available_actions":
        return 200, api.available_actions(instance_id)
    if op == "expert":
        return 200, api.expert(instance_id)
    if op == "close":
        return 200, api.close(instance_id)
    raise ServerError(404, f"unknown op {op!r} (the ops: {', '.join(OPS)})")
