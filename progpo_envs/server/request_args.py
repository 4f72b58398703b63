"""Reading the env server's requests: the JSON body and the validated arguments of a reset or a step.

Every door of the server uses these: its own routes (:mod:`~progpo_envs.server.app`), their stream door
(:mod:`~progpo_envs.server.stream`, whose messages are not Flask requests: it passes each message's budget,
:func:`request_budget`) and AgentGym's routes (:mod:`~progpo_envs.server.agentgym`). Anything a client got
wrong raises :class:`~progpo_envs.server.pool.ServerError` with status 400 and a message naming the field; a
body that is not a JSON object raises :class:`progpo_base.http.RequestError` (the shop's session API reads its
bodies with the same :func:`progpo_base.http.json_object`).

Nothing is built from a request before its size is known to be bounded: the body is at most
:data:`MAX_REQUEST_BYTES`, holds at most :data:`MAX_JSON_VALUES` JSON values (counted on the raw bytes before
parsing: an 8 MiB body of ``{},{},...`` would otherwise become 2.8 million Python dicts), is parsed without
``NaN``/``Infinity`` (not JSON; ``task_index: Infinity`` would reach the env) and nests at most
:data:`MAX_JSON_DEPTH` levels in what is decoded (413 for the first, 400 for the others). What the decoded
fields of one request may allocate (numpy values in ``options``, all items of a batch together) is bounded by
the request's own size (:func:`decode_budget`): an 85-byte request cannot make the server allocate 8 MiB.

Example:
    >>> reset_args({"seed": 3})
    {'seed': 3, 'options': None, 'seq': None}
    >>> step_args({"action": "look", "seq": 2})
    {'action': 'look', 'seq': 2}
    >>> available_actions({"admissible_actions": ["look", "inventory"], "won": False})
    ['look', 'inventory']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flask import g, request
from werkzeug.exceptions import HTTPException

from progpo_base.http import json_object
from progpo_envs.server.codec import CodecError, DecodeBudget, decode
from progpo_envs.server.pool import ServerError

_MAX_SEED = 2**64
#: Largest request body (bytes): an action is at most a few KiB, a batch a few thousand of them.
MAX_REQUEST_BYTES = 8 << 20
#: Most JSON values (objects, arrays and array items) in a body: 32 per item of the largest batch.
MAX_JSON_VALUES = 1 << 17
#: Deepest nesting of decoded options or kwargs (an env's options are flat: ``{"task_index": 3}``).
MAX_JSON_DEPTH = 16
#: Most digits of an integer in a message (the OpenEnv door's bound; a seed is below 2**64: 20 digits).
MAX_INT_DIGITS = 32
#: Bytes of numpy values a request may decode per byte of its body (a 2-byte JSON number becomes 8 bytes, a
#: character 4), at least :data:`MIN_DECODE_BYTES` and at most :data:`MAX_REQUEST_BYTES`.
DECODE_BYTES_PER_BODY_BYTE = 8
#: The decode budget of a small request.
MIN_DECODE_BYTES = 64 << 10


def json_body() -> dict[str, Any]:
    """The request's JSON object (:func:`progpo_base.http.json_object`: empty for an empty body, a
    :class:`~progpo_base.http.RequestError` 400 for anything else, 413 for too much)."""
    try:
        raw = request.get_data(cache=True)  # Flask's MAX_CONTENT_LENGTH answers 413 past MAX_REQUEST_BYTES
    except HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - the WSGI server's parse errors (gunicorn's InvalidChunkSize is
        # a plain Exception), a client that hung up: all about the client's bytes
        raise ServerError(400, f"the request body could not be read ({type(exc).__name__})") from None
    return json_object(raw, MAX_JSON_VALUES)


def request_client() -> str:
    """The client the request counts against (its host or client token: :mod:`webshop_server.clients`), as
    the app found it before the request ran."""
    return g.client


def request_budget(size: int) -> DecodeBudget:
    """The budget for the decoded values of a request of ``size`` bytes, shared by all its fields:
    :data:`DECODE_BYTES_PER_BODY_BYTE` times its size, within [:data:`MIN_DECODE_BYTES`,
    :data:`MAX_REQUEST_BYTES`]."""
    return DecodeBudget(min(MAX_REQUEST_BYTES, max(MIN_DECODE_BYTES, DECODE_BYTES_PER_BODY_BYTE * size)))


def decode_budget() -> DecodeBudget:
    """The HTTP request's budget for decoded values (:func:`request_budget` of its body's size)."""
    if "decode_budget" not in g:
        g.decode_budget = request_budget(len(request.get_data(cache=True)))
    return g.decode_budget


def decode_arg(name: str, raw: Any, budget: DecodeBudget | None = None) -> Any:
    """A codec-encoded field of a request, decoded within the request's budget (400 naming ``name``);
    ``budget``: the budget of a request that is not Flask's (the stream door's messages)."""
    try:
        return decode(raw, max_depth=MAX_JSON_DEPTH, budget=budget if budget is not None else decode_budget())
    except CodecError as exc:
        raise ServerError(
            400, f"{name}: {exc} (a request may decode {DECODE_BYTES_PER_BODY_BYTE} times its own size)"
        ) from None


def seed_arg(body: Mapping[str, Any]) -> int | None:
    """The body's reset ``seed``: ``None`` or an integer in ``[0, 2**64)``."""
    seed = body.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _MAX_SEED:
        raise ServerError(400, "seed must be null or an integer in [0, 2**64)")
    return seed


def options_arg(body: Mapping[str, Any], budget: DecodeBudget | None = None) -> dict[str, Any] | None:
    """The body's reset ``options`` (codec-decoded): ``None`` or an object with string keys."""
    raw = body.get("options")
    if raw is None:
        return None
    options = decode_arg("options", raw, budget)
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ServerError(400, "options must be a JSON object")
    task_index = options.get("task_index")
    if task_index is not None and (
        isinstance(task_index, bool) or not isinstance(task_index, (int, np.integer))
    ):
        raise ServerError(400, f"options: task_index must be null or an integer, got {task_index!r}")
    return options


def _seq_arg(body: Mapping[str, Any]) -> int | None:
    seq = body.get("seq")
    if seq is None:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63:
        raise ServerError(400, "seq must be null or a positive integer")
    return seq


def _action_arg(body: Mapping[str, Any]) -> str | None:
    if "action" not in body:
        raise ServerError(400, "missing 'action'")
    action = body["action"]
    if action is not None and not isinstance(action, str):
        raise ServerError(400, "action must be a string (or null for a non-text action, an invalid action)")
    return action


def reset_args(body: Mapping[str, Any], budget: DecodeBudget | None = None) -> dict[str, Any]:
    """Validated arguments of a reset (``budget``: see :func:`decode_arg`)."""
    return {"seed": seed_arg(body), "options": options_arg(body, budget), "seq": _seq_arg(body)}


def step_args(body: Mapping[str, Any], budget: DecodeBudget | None = None) -> dict[str, Any]:
    """Validated arguments of a step (nothing in them is decoded: ``budget`` is unused)."""
    return {"action": _action_arg(body), "seq": _seq_arg(body)}


def available_actions(info: Mapping[str, Any]) -> Any:
    """The env's list of actions from its info (``admissible_actions`` or ``available_actions``)."""
    for key in ("admissible_actions", "available_actions"):
        if key in info:
            return info[key]
    return None
