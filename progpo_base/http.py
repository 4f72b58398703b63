"""Reading a request's JSON the same way in every server: the shop's session API, the env server's routes and
its OpenEnv door (HTTP bodies and WebSocket messages).

:func:`json_object` and :func:`json_value` are pure (the request's bytes or text in, the value out), so each
server reads its body or message once, its own way, and hands it over. A client's mistake is a
:class:`RequestError` carrying the HTTP status to answer with: 413 for more than ``max_values`` JSON values
(counted on the raw text before parsing: an 8 MiB body of ``{},{},...`` would otherwise become millions of
Python dicts), 400 for what is not JSON (``NaN`` and ``Infinity`` are not) or nests deeper than the parser can
go, or for a body that is not an object. Bounds a server may add: ``max_depth`` (deepest nesting),
``max_int_digits`` (the longest integer literal, checked before Python converts it: a 5,000-digit integer
costs time and is refused by Python itself with a ``ValueError``) and ``text_only`` (no lone surrogate such as
``"\\ud800"`` in a string, which no UTF-8 answer can echo); a value over one of them is a 422.

Example:
    >>> json_object(b'{"action": "look"}', max_values=8)
    {'action': 'look'}
    >>> json_object(b"", max_values=8)
    {}
    >>> json_object(b"[1, 2]", max_values=8)
    Traceback (most recent call last):
    progpo_base.http.RequestError: the request body must be a JSON object
    >>> json_object(b'{"seed": NaN}', max_values=8).status  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    progpo_base.http.RequestError: the request body is not valid JSON: NaN is not JSON
    >>> json_value('{"a": [[1]]}', max_values=8, max_depth=2, what="the message")
    Traceback (most recent call last):
    progpo_base.http.RequestError: the message nests deeper than 2 levels
    >>> json_value('{"seed": 123456}', max_values=8, max_int_digits=4, what="the message")
    Traceback (most recent call last):
    progpo_base.http.RequestError: the message holds an integer of 6 digits (at most 4)
"""

from __future__ import annotations

import json
import re
from typing import Any

#: A lone surrogate: what ``"\ud800"`` decodes to; no UTF-8 text holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")


class RequestError(Exception):
    """A client error with the HTTP status it is answered with and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _bounded_int(max_digits: int, what: str):
    def parse(text: str) -> int:
        digits = len(text) - text.startswith("-")
        if digits > max_digits:
            raise RequestError(422, f"{what} holds an integer of {digits} digits (at most {max_digits})")
        return int(text)

    return parse


def _check_tree(value: Any, max_depth: int | None, text_only: bool, what: str) -> None:
    """The nesting of ``value`` within ``max_depth`` and, with ``text_only``, no lone surrogate in a string
    (iterative: the walk costs one step per decoded value, already bounded by ``max_values``)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if max_depth is not None and depth > max_depth:
                raise RequestError(422, f"{what} nests deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
            if text_only and isinstance(item, dict):
                stack.extend((key, depth) for key in item)
        elif text_only and isinstance(item, str) and (lone := _SURROGATE.search(item)):
            raise RequestError(422, f"{what} holds a lone surrogate (\\u{ord(lone[0]):x}), not text")


def json_value(
    raw: bytes | str,
    max_values: int,
    *,
    max_depth: int | None = None,
    max_int_digits: int | None = None,
    text_only: bool = False,
    what: str = "the request body",
) -> Any:
    """The JSON value ``raw`` holds, within the bounds given (module docstring); :class:`RequestError`
    otherwise (``what`` names the request in its message)."""
    opening = (b"{", b"[", b",") if isinstance(raw, bytes) else ("{", "[", ",")
    # every object, array and array item but the first of each opens with "{", "[" or ","; counted at C speed
    if sum(raw.count(mark) for mark in opening) > max_values:
        raise RequestError(413, f"{what} holds more than {max_values} JSON values")
    hooks: dict[str, Any] = {"parse_constant": _no_constants}
    if max_int_digits is not None:
        hooks["parse_int"] = _bounded_int(max_int_digits, what)
    try:
        value = json.loads(raw, **hooks)
    except RecursionError:
        if max_depth is not None:
            raise RequestError(422, f"{what} nests deeper than {max_depth} levels") from None
        raise RequestError(400, f"{what} is nested too deeply") from None
    except RequestError:
        raise
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RequestError(400, f"{what} is not valid JSON: {exc}") from None
    if max_depth is not None or text_only:
        _check_tree(value, max_depth, text_only, what)
    return value


def json_object(raw: bytes | str, max_values: int, **bounds: Any) -> dict[str, Any]:
    """The JSON object a request body holds (empty for an empty body); :class:`RequestError` otherwise.
    ``bounds``: those of :func:`json_value`."""
    if not raw:
        return {}
    what = bounds.get("what", "the request body")
    body = json_value(raw, max_values, **bounds)
    if not isinstance(body, dict):
        raise RequestError(400, f"{what} must be a JSON object")
    return body
