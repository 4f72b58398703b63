"""Reading a request's JSON body the same way in both servers: the shop's session API and the env server.

:func:`json_object` is pure (the body's bytes in, a dict out), so each Flask app reads its body once, its own
way, and hands the bytes over. A client's mistake is a :class:`RequestError` carrying the HTTP status to
answer with: 413 for a body of more than ``max_values`` JSON values (counted on the raw bytes before parsing:
an 8 MiB body of ``{},{},...`` would otherwise become millions of Python dicts), 400 for a body that is not
JSON (``NaN`` and ``Infinity`` are not), nests deeper than the parser can go, or is not an object.

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
"""

from __future__ import annotations

import json
from typing import Any


class RequestError(Exception):
    """A client error with the HTTP status it is answered with and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_object(raw: bytes, max_values: int) -> dict[str, Any]:
    """The JSON object a request body holds (empty for an empty body); :class:`RequestError` otherwise."""
    if not raw:
        return {}
    # every object, array and array item but the first of each opens with "{", "[" or ","; counted at C speed
    if raw.count(b"{") + raw.count(b"[") + raw.count(b",") > max_values:
        raise RequestError(413, f"the request body holds more than {max_values} JSON values")
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise RequestError(400, "the request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body
