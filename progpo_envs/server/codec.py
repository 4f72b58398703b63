"""Exact JSON encoding of env values (observations, infos, options) for the env server and its client.

Plain JSON loses what the trainer relies on: ``info["obs_hash"]`` is a ``numpy.uint64``,
``info["history_keys"]`` is a dict with ``int`` keys, and tuples come back as lists. :func:`encode` turns a
value into JSON-safe data with small tagged objects for everything JSON cannot say, and :func:`decode`
restores the identical Python value, so a remote env returns ``==``-equal observations and infos *of the same
types* as the in-process env.

Tags (an object whose only keys are a tag and its payload):

* ``{"$np": dtype, "v": value}`` — a numpy scalar (``uint64`` digests stay exact: JSON integers are unbounded
in
  Python; the value is a string for non-finite floats);
* ``{"$nd": dtype, "shape": [...], "v": [...]}`` — a numpy array (numeric, bool, str or object dtype);
* ``{"$tuple": [...]}``, ``{"$bytes": base64}``, ``{"$float": "nan" | "inf" | "-inf"}``;
* ``{"$dict": [[key, value], ...]}`` — a dict with any non-``str`` key, or a ``str`` key starting with ``$``
(so a
  plain dict can never be mistaken for a tag).

Decoding is bounded, so a small payload cannot make a large allocation: nesting deeper than ``max_depth``
and arrays (or numpy scalars) whose ``itemsize × size`` would exceed ``max_bytes`` in all are
:class:`CodecError` errors, checked from the tag before anything is allocated (a
``{"$nd": "<U50000000", ...}`` of 86 bytes would otherwise allocate 200 MB). Several payloads may share one
:class:`DecodeBudget` (the env server gives each request one, for all the fields it decodes).

Example:
    >>> import numpy as np
    >>> info = {"obs_hash": np.uint64(2**64 - 1), "history_keys": {1: np.uint64(7)}, "pair": (1, "a")}
    >>> decode(json.loads(json.dumps(encode(info)))) == info
    True
    >>> type(decode(encode(info))["obs_hash"]).__name__
    'uint64'
    >>> try:
    ...     decode({"$nd": "<U50000000", "shape": [1], "v": ["a"]}, max_bytes=1 << 20)
    ... except CodecError as exc:
    ...     print(exc)
    $nd of 200000000 bytes is over the 1048576-byte limit
"""

from __future__ import annotations

import base64
import functools
import json
import math
from typing import Any

import numpy as np

_TAGS = {"$np", "$nd", "$tuple", "$bytes", "$float", "$dict"}
#: Default nesting limit of :func:`decode`: deeper than any env's info, far below Python's recursion limit.
MAX_DEPTH = 64


class CodecError(ValueError):
    """A value cannot be encoded, or a payload is not a valid encoding."""


def _encode_float(value: float) -> Any:
    return value if math.isfinite(value) else {"$float": repr(value)}


#: Exact types whose values are JSON as they are: :func:`encode` and :func:`decode` return them unchanged
#: without a look at anything else (the fast path of every step's info: strings, flags, counts).
_PLAIN = frozenset({str, bool, int, type(None)})
_PLAIN_OR_FLOAT = _PLAIN | {float}


def encode(value: Any) -> Any:
    """JSON-safe data that :func:`decode` turns back into exactly ``value``."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:  # a plain dict of plain keys, built in one pass (any other key: the general case)
        out = {}
        for key, item in value.items():
            if type(key) is not str or key[:1] == "$":
                return _encode_any(value)
            out[key] = item if type(item) in _PLAIN else encode(item)
        return out
    if kind is list:
        return [item if type(item) in _PLAIN else encode(item) for item in value]
    if kind is float:
        return _encode_float(value)
    return _encode_any(value)


def _encode_any(value: Any) -> Any:
    """:func:`encode` of any value (subclasses, numpy values, tuples, dicts with other keys, bytes)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, np.generic):
        item = value.item()
        if isinstance(item, float):
            item = item if math.isfinite(item) else repr(item)
        elif isinstance(item, (bytes, complex)) or not isinstance(item, (int, bool, str)):
            raise CodecError(f"cannot encode numpy scalar of dtype {value.dtype}")
        return {"$np": value.dtype.str, "v": item}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufUO":
            raise CodecError(f"cannot encode numpy array of dtype {value.dtype}")
        flat = (
            [encode(x) for x in value.reshape(-1).tolist()]
            if value.dtype.kind == "O"
            else [_encode_float(x) if isinstance(x, float) else x for x in value.reshape(-1).tolist()]
        )
        return {"$nd": value.dtype.str, "shape": list(value.shape), "v": flat}
    if isinstance(value, tuple):
        return {"$tuple": [encode(x) for x in value]}
    if isinstance(value, list):
        return [encode(x) for x in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise CodecError(f"cannot encode a value of type {type(value).__name__}")


def _decode_float(value: Any) -> float:
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise CodecError(f"bad non-finite float {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CodecError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _dtype(text: Any) -> np.dtype:
    if not isinstance(text, str):
        raise CodecError("dtype must be a string")
    return _parse_dtype(text)


@functools.lru_cache(maxsize=256)  # the same few dtypes ("<u8") in every info: parsed once each
def _parse_dtype(text: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise CodecError(f"unknown dtype {text!r}") from exc
    if dtype.kind not in "biufUO":
        raise CodecError(f"unsupported dtype {text!r}")
    return dtype


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError as exc:
        raise CodecError(f"dict key of type {type(key).__name__} is not hashable") from exc
    return key


class DecodeBudget:
    """Bytes that the numpy values of one or more :func:`decode` calls may still allocate together.

    Example:
        >>> budget = DecodeBudget(8000)
        >>> _ = decode({"$nd": "<U1000", "shape": [1], "v": ["a"]}, budget=budget)
        >>> budget.bytes_left
        4000
    """

    def __init__(self, max_bytes: int):
        self.bytes_left = int(max_bytes)

    def charge(self, tag: str, nbytes: int) -> None:
        """Take ``nbytes`` for a ``tag`` value (:class:`CodecError` past what is left)."""
        if nbytes > self.bytes_left:
            raise CodecError(f"{tag} of {nbytes} bytes is over the {self.bytes_left}-byte limit")
        self.bytes_left -= nbytes


def decode(
    data: Any,
    *,
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
    budget: DecodeBudget | None = None,
) -> Any:
    """The value :func:`encode` made ``data`` from (:class:`CodecError` on bad data).

    Args:
        data: Parsed JSON.
        max_depth: Deepest nesting of lists, objects and tags accepted.
        max_bytes: Most bytes all numpy arrays and scalars in ``data`` may allocate together (``None``: no
            limit, for answers from a server one trusts); checked from each tag's dtype and shape first.
        budget: A budget shared with other calls, instead of ``max_bytes``.
    """
    if budget is None and max_bytes is not None:
        budget = DecodeBudget(max_bytes)
    return _Decoder(max_depth, budget).decode(data, 0)


class _Decoder:
    """One :func:`decode` call: its depth limit and its allocation budget (``None``: unlimited)."""

    def __init__(self, max_depth: int, budget: DecodeBudget | None):
        self.max_depth = max_depth
        self.budget = budget

    def charge(self, tag: str, nbytes: int) -> None:
        if self.budget is not None:
            self.budget.charge(tag, nbytes)

    def decode(self, data: Any, depth: int) -> Any:
        kind = type(data)
        if kind in _PLAIN_OR_FLOAT:
            return data
        if depth >= self.max_depth:
            raise CodecError(f"nested deeper than {self.max_depth} levels")
        depth += 1
        if kind is list:
            return [x if type(x) in _PLAIN_OR_FLOAT else self.decode(x, depth) for x in data]
        if kind is dict:  # no tag and plain keys, in one pass (else the general case below)
            out = {}
            for key, item in data.items():
                if type(key) is not str or key[:1] == "$":
                    return self.decode_any(data, depth)
                out[key] = item if type(item) in _PLAIN_OR_FLOAT else self.decode(item, depth)
            return out
        return self.decode_any(data, depth)

    def decode_any(self, data: Any, depth: int) -> Any:
        """:meth:`decode` of anything but a scalar (``depth`` already counts this level)."""
        if data is None or isinstance(data, (bool, int, str, float)):
            return data
        if isinstance(data, list):
            return [self.decode(x, depth) for x in data]
        if not isinstance(data, dict):
            raise CodecError(f"unexpected JSON value of type {type(data).__name__}")
        tag = next((k for k in data if k in _TAGS), None)
        if tag is None:
            if any(k.startswith("$") for k in data):
                raise CodecError(f"unknown tag in {sorted(data)[:3]}")
            return {k: self.decode(v, depth) for k, v in data.items()}
        try:
            return self.decode_tag(tag, data, depth)
        except CodecError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"malformed {tag} value: {exc}") from exc

    def decode_tag(self, tag: str, data: dict, depth: int) -> Any:
        if tag == "$np":
            dtype = _dtype(data["$np"])
            if dtype.kind in "O":
                raise CodecError("object numpy scalars are not supported")
            self.charge(tag, dtype.itemsize)
            value = data["v"]
            if dtype.kind == "f":
                value = _decode_float(value)
            return dtype.type(value)
        if tag == "$nd":
            dtype = _dtype(data["$nd"])
            values = _as_list(data["v"])
            shape = tuple(int(s) for s in _as_list(data["shape"]))
            if any(s < 0 for s in shape) or len(values) != math.prod(shape):
                raise CodecError("array shape does not match its values")
            self.charge(tag, dtype.itemsize * len(values))  # before numpy allocates anything
            if dtype.kind == "O":
                out = np.empty(len(values), dtype=object)
                for i, item in enumerate(values):
                    out[i] = self.decode(item, depth)
                return out.reshape(shape)
            values = [_decode_float(x) for x in values] if dtype.kind == "f" else values
            return np.array(values, dtype=dtype).reshape(shape)
        if tag == "$tuple":
            return tuple(self.decode(x, depth) for x in _as_list(data["$tuple"]))
        if tag == "$bytes":
            return base64.b64decode(data["$bytes"], validate=True)
        if tag == "$float":
            return _decode_float(data["$float"])
        return {
            _hashable(self.decode(k, depth)): self.decode(v, depth)
            for k, v in (_pair(p) for p in _as_list(data["$dict"]))
        }


def _as_list(value: Any) -> list:
    if not isinstance(value, list):
        raise CodecError(f"expected a list, got {type(value).__name__}")
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise CodecError("a $dict entry must be a [key, value] pair")
    return value[0], value[1]


def dumps(value: Any) -> str:
    """``json.dumps(encode(value))`` in strict JSON (no NaN literals)."""
    return json.dumps(encode(value), allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """The inverse of :func:`dumps`."""
    return decode(json.loads(text))
