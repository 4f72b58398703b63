"""Per-copy infos from a Gymnasium vector env: its batched ``info`` taken apart into one plain dict per copy.

A vector env's ``info`` is a dict of arrays with ``_key`` masks (``VectorEnv._add_info``); callers that play
each copy (the agent harness, the training loop) want one dict per copy with plain Python values.
:func:`unbatch_info` takes any batched info apart; :func:`unbatch_copy_infos` gives the same result straight
from the copies' own infos, without building the arrays
(:meth:`~progpo_envs.core.vector.GroupVectorEnv.step_copies` hands its infos out that way).

Example:
    >>> import numpy as np
    >>> info = {"won": np.array([True, False]), "_won": np.array([True, True]),
    ...         "expert_action": np.array(["look", None], dtype=object),
    ...         "_expert_action": np.array([True, False])}
    >>> unbatch_info(info, 2)
    [{'won': True, 'expert_action': 'look'}, {'won': False}]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def unbatch_info(info: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector ``info`` (dict of arrays with ``_key`` masks, nested dicts) → one dict per copy.

    Values become plain Python values (``ndarray.tolist``; 64-bit keys become ``int``); a nested dict left
    empty in a copy is left out.
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if isinstance(key, str) and key[:1] == "_":
            continue
        if isinstance(value, dict):
            for i, sub in enumerate(unbatch_info(value, num_envs)):
                if sub:
                    out[i][key] = sub
            continue
        values = value.tolist() if isinstance(value, np.ndarray) else list(value)
        mask = info.get(f"_{key}")  # (keys need not be strings: history_keys maps depths to keys)
        present = [True] * num_envs if mask is None else mask.tolist()
        for i in range(num_envs):
            if present[i]:
                out[i][key] = values[i]
    return out


class _Irregular(Exception):
    """Infos that :func:`unbatch_copy_infos` leaves to batching and unbatching."""


_MISSING = object()
#: Types of values an object column hands back unchanged (anything else goes through numpy to be sure).
_PLAIN_OBJECTS = frozenset({str, int, float, bool, type(None), list})
_INT64_RANGE = range(-(2**63), 2**63)


def _through(value: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """``value`` after a trip through a one-element column of ``dtype``: numpy's own casting and errors."""
    column = np.zeros((1, *shape), dtype=dtype)
    column[0] = value  # the assignment _add_info makes, into the column it would make
    return column.tolist()[0]


#: Types that come back unchanged from a column typed by a value of the same type (int: within int64).
_OWN_TYPE_UNCHANGED = frozenset({str, float, bool, type(None), list})


def _convert(key: Any, value: Any, first: Any) -> Any:
    """``value`` as it comes back from the column batching puts it in, which ``first`` typed."""
    kind = type(first)
    value_type = type(value)
    if key == "final_obs" or not (kind in (int, float, bool) or issubclass(kind, np.number)):
        if key != "final_obs" and isinstance(first, np.ndarray):
            return _through(value, first.dtype, first.shape)
        return value if value_type in _PLAIN_OBJECTS else _through(value, object, ())  # an object column
    if value_type is not kind:
        return _through(value, kind, ())
    if kind is int:
        return value if value in _INT64_RANGE else _through(value, kind, ())
    if kind is float or kind is bool:
        return value
    return value.item()  # a numpy scalar of the column's own dtype


def _unbatch_level(infos: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Per-copy infos as batching them and :func:`unbatch_info` would leave them (``None``: no dict here).

    ``VectorEnv._add_info`` types each key's column by the first value it gets (``int``/``float``/``bool``
    and numpy numbers: that dtype; arrays: their dtype and shape; ``final_obs`` and anything else:
    ``object``), assigns every copy's value into it, and :func:`unbatch_info` reads the column back with
    ``tolist``. Values of the column's own type take a shortcut with the same result; others go through a
    one-element column of that dtype.
    """
    first_values: dict[Any, Any] = {}  # key -> its first value, keys in order of first appearance
    nested: list[Any] = []  # keys batched as nested dicts
    other_keys: list[Any] = []  # keys that are not strings
    for info in infos:
        if info is not None:
            for key, value in info.items():
                if key not in first_values:
                    first_values[key] = value
                    if key.__class__ is not str:
                        other_keys.append(key)
                    if isinstance(key, str) and key[:1] == "_":  # skipped by unbatch_info (a mask name)
                        raise _Irregular(key)
                    if key != "final_obs" and isinstance(value, dict):
                        nested.append(key)
    if other_keys and len({f"_{key}" for key in first_values}) < len(first_values):
        raise _Irregular(other_keys)  # e.g. 1 and "1": two keys that batching gives one mask "_1"
    order = list(first_values)
    out: list[dict[str, Any]] = []
    for n, info in enumerate(infos):
        entry: dict[str, Any] = {}
        out.append(entry)
        if info is None:
            continue
        # keys in the order batching puts them (first appearance): the copy's own order in the usual case
        items: Any = info.items()
        if n and list(info) != order[: len(info)]:
            items = [(key, info[key]) for key in order if key in info]
        for key, value in items:
            value_type = type(value)
            if value_type is type(first_values[key]) and (
                value_type in _OWN_TYPE_UNCHANGED or (value_type is int and value in _INT64_RANGE)
            ):
                entry[key] = value  # the common case: a plain value in a column of its own type
            elif key in nested:
                if not isinstance(value, dict):
                    raise _Irregular(key)
                entry[key] = None  # keeps the key's place; filled below
            elif key != "final_obs" and isinstance(value, dict):
                raise _Irregular(key)
            else:
                entry[key] = _convert(key, value, first_values[key])
    for key in nested:  # batched and unbatched recursively, across the copies
        subs = _unbatch_level([None if info is None else info.get(key) for info in infos])
        for entry, sub in zip(out, subs, strict=True):
            if sub:
                entry[key] = sub
            elif key in entry:  # unbatch_info leaves out a nested dict that is empty in a copy
                del entry[key]
    return out


def unbatch_copy_infos(
    copy_infos: Sequence[dict[str, Any]], batch: Callable[[Sequence[dict[str, Any]]], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``unbatch_info(batch(copy_infos))``: what a vector env's batched info unbatches to, without the arrays.

    For vector envs that can hand out their copies' infos before batching them
    (:meth:`~progpo_envs.core.vector.GroupVectorEnv.step_copies`): the values come out exactly as batching
    and :func:`unbatch_info` would leave them (same keys in the same order, numpy scalars as Python values,
    each value cast to its column's dtype), at a fraction of the cost. Infos whose batching is irregular
    (keys that start with ``_``, a key that is a dict in one copy and not in another) take the long way.

    Args:
        copy_infos: One info per copy.
        batch: The vector env's batching (per-copy infos → Gymnasium's dict of arrays).

    Example:
        >>> import numpy as np
        >>> from gymnasium.vector import VectorEnv
        >>> envs = VectorEnv(); envs.num_envs = 2
        >>> def batch(infos):
        ...     merged = {}
        ...     for i, info in enumerate(infos):
        ...         merged = envs._add_info(merged, info, i)
        ...     return merged
        >>> unbatch_copy_infos([{"score": 1, "hash": np.uint64(7)}, {"score": 2.5}], batch)
        [{'score': 1, 'hash': 7}, {'score': 2}]
    """
    try:
        return _unbatch_level(copy_infos)
    except _Irregular:
        return unbatch_info(batch(copy_infos), len(copy_infos))
