"""How every ``progpo`` command line reports usage: one-line errors with exit status 2, help with defaults.

Tools people know (``git``, ``pip``, ``docker``) answer a mistyped argument with one line that says what is
wrong and what would be right, exit with status 2, and show each option's default in ``--help``. The
``progpo`` subcommands build their parsers from :class:`CommandParser` (``train`` and ``eval`` add their
config keys to it with :mod:`progpo_base.config`) and raise :class:`UsageError` for what they check
themselves (a path that does not exist, an unknown env id or split), so they behave alike. The module lives
in the base package, below every layer, so that every command line shares it, the shop's own
(``progpo webshop``) included.

Example:
    >>> parser = CommandParser(prog="progpo demo", description="A demo.")
    >>> _ = parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    >>> "(default: 8000)" in parser.format_help()
    True
    >>> suggestion("progpo/Alfworld-v0", ["progpo/ALFWorld-v0", "progpo/WebShop-v0"])
    " (did you mean 'progpo/ALFWorld-v0'?)"
"""

from __future__ import annotations

import argparse
import difflib
import errno
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn


class UsageError(Exception):
    """A mistake in a command line that the user can fix; reported as one line, exit status 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default after its help, unless it has none (``None``, off flags, ``[]``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default == []:
            return action.help or ""
        return super()._get_help_string(action) or ""


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: error: message``, exit 2), help with defaults.

    Subcommand parsers made with ``add_subparsers().add_parser`` are of this class too.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def suggestion(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest of ``choices`` to a mistyped ``name``, or ``""``."""
    choices = list(choices)
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def one_of(what: str, name: str, choices: Iterable[str]) -> UsageError:
    """The error for ``name`` not among ``choices``: the closest match and the valid ones, in one line."""
    choices = list(choices)
    return UsageError(f"unknown {what} {name!r}{suggestion(name, choices)}; choose from {', '.join(choices)}")


def existing_dir(flag: str, path: str | None) -> Path | None:
    """``path`` as an existing folder (``None`` stays ``None``); else :class:`UsageError` naming ``flag``."""
    if path is None:
        return None
    folder = Path(path).expanduser()
    if not folder.is_dir():
        reason = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{flag} {path} {reason}")
    return folder


#: Where the project keeps what it generates and builds (games, catalogs, indexes): the usual fix of a cache
#: that cannot be written.
_CACHE_FIX = "point PROGPO_CACHE at a folder with room that this user can write"


def failure_line(error: BaseException) -> str:
    """What went wrong while a server started, in one line with the fix.

    A full disk and a cache that cannot be written (read-only, another user's) get the fix spelled out; any
    other error is its type and message on one line (the project's own errors already name the file and the
    fix: a damaged cache entry, a missing split).

    Example:
        >>> failure_line(OSError(errno.ENOSPC, "No space left on device", "/cache/index")).split(": ")[0]
        'no space left on the device of /cache/index'
        >>> failure_line(ValueError("bad   thing"))
        'ValueError: bad thing'
    """
    text = " ".join(str(error).split())
    if isinstance(error, OSError) and error.errno == errno.ENOSPC or "No space left on device" in text:
        where = getattr(error, "filename", None) or "the cache"
        return f"no space left on the device of {where}: free some, or {_CACHE_FIX}"
    if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"cannot write {error.filename or 'the cache'} ({error.strerror}): the cache is not complete "
            f"there and cannot be completed; fill it once where it is writable, or {_CACHE_FIX}"
        )
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def report(prog: str, error: Exception) -> int:
    """Print ``error`` as one line (``prog: error: message``) on stderr; returns the exit status 2."""
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
