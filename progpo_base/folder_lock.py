"""One process at a time writes a run folder: ``progpo eval``'s ``--out`` or ``progpo train``'s run dir.

Two runs appending to one ``trajectories.jsonl`` duplicate its episodes; two trainings on one run dir write
duplicate metric rows and overwrite each other's checkpoints; an evaluation and a training on one folder
overwrite each other's ``summary.json``. So a command holds its folder's lock for as long as it writes there,
taken before it writes anything: :func:`folder_lock`, an exclusive ``flock`` on :data:`LOCK_FILE` in the
folder. Every command takes the same file, so whichever writes a folder first keeps every other one out. The
kernel releases the lock when the process ends, however it ends (a killed run leaves no stale lock to clean
up: the next run just takes it), and the file names the holder (``progpo eval (pid 1234)``). The name stays
after the holder ends: it says which command's files the folder holds, and another command is refused there
too (an evaluation would overwrite a finished training's ``summary.json`` as surely as a live one's).

Taking the lock is also the first write in the folder, so a folder the command cannot write (a read-only
file system, another user's folder, a file where the folder should be) is refused there, before the run
writes anything. The refusals are a :class:`FolderRefused`: one line that names the folder, the holder or
the reason, and what to do.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with folder_lock(folder, "progpo demo", "give another --out"):
    ...     (folder / LOCK_FILE).read_text().startswith("progpo demo (pid ")
    True
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

#: The lock's file name, the same in every run folder whichever command writes it.
LOCK_FILE = ".progpo.lock"


class FolderRefused(ValueError):
    """The command cannot write its output folder (a usage error: the command says so in one line)."""


class FolderBusy(FolderRefused):
    """Another process holds the folder's lock."""


class FolderNotWritable(FolderRefused):
    """The folder cannot be made or written by this process."""


@contextlib.contextmanager
def folder_lock(folder: str | Path, command: str, alternative: str) -> Iterator[None]:
    """Hold ``folder``'s lock (:data:`LOCK_FILE` in it, the folder made if needed) for the block.

    Args:
        folder: The output folder.
        command: What writes the folder (``progpo train``), recorded in the lock file as the holder.
        alternative: What a refused user may do instead, for the refusal (``give another --out``).

    Raises:
        FolderBusy: another process holds the lock.
        FolderNotWritable: the folder or its lock file cannot be made.
        FolderRefused: the folder holds another command's run.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = (folder / LOCK_FILE).open("a+")
    except OSError as error:
        reason = _reason(folder, error)
        raise FolderNotWritable(f"cannot write in {folder}: {reason}; {alternative}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise FolderBusy(
                f"{folder} is being written by {holder}: wait for it to end, or {alternative}"
            ) from None
        handle.seek(0)
        previous = _holder_command(handle.read())
        if previous not in (None, command):
            raise FolderRefused(f"{folder} holds the files of a {previous} run: {alternative}")
        handle.seek(0)
        handle.truncate()
        handle.write(f"{command} (pid {os.getpid()})\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock


def _reason(folder: Path, error: OSError) -> str:
    """Why ``folder`` could not be made or written, naming the path in the way."""
    if error.errno in (errno.ENOTDIR, errno.EEXIST):  # a file where the folder or a parent should be
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        return f"{blocking} is a file, not a folder"
    where = f" ({error.filename})" if error.filename and Path(error.filename) != folder else ""
    return f"{error.strerror or error}{where}"


def _holder_command(text: str) -> str | None:
    """The command a lock file names (``progpo eval`` of ``progpo eval (pid 1234)``); ``None`` for an empty
    file or one in another form."""
    named = re.fullmatch(r"(.+) \(pid \d+\)", text.strip())
    return named.group(1) if named else None
