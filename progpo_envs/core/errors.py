"""Errors an env raises that are not its caller's fault.

An env server answers a request the client got wrong with a 4xx, and anything else with a 5xx. Most env
exceptions sort themselves (a ``ValueError`` from a bad ``task_index`` is the caller's), but a damaged file on
the server's side (a corrupted cache entry, a truncated game file) surfaces as a ``ValueError`` too (a
``JSONDecodeError``). An env raises :class:`EnvDataError` for those, so the server answers 500 naming the file
and says how to fix it, instead of blaming the request.

Example:
    >>> isinstance(EnvDataError("the cached game /c/g.tw-pddl is not a game file"), ValueError)
    False
"""

from __future__ import annotations


class EnvDataError(RuntimeError):
    """A file the env reads is damaged or cannot be written where it must be: the server's to fix.

    The message names the file and the fix (e.g. delete it to have it rebuilt, or make the cache writable).
    """
