"""One process at a time writes an output folder: ``progpo eval``'s ``--out`` and ``progpo train``'s run dir.

Two runs appending to one ``trajectories.jsonl`` duplicate its episodes; two trainings on one run dir write
duplicate metric rows and overwrite each other's checkpoints. So a command holds its folder's lock for as long
as it writes there, taken before it writes anything: :func:`folder_lock`, an exclusive ``flock`` on a file in
the folder. The kernel releases it when the process ends, however it ends (a killed run leaves no stale lock
to clean up: the next run just takes it), and the file names the holder (``pid 1234``). A second process is
refused at once with :class:`FolderBusy`, a one-line message naming the holder and what to do.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with folder_lock(folder, ".demo.lock", "progpo demo", "give another --out"):
    ...     (folder / ".demo.lock").read_text().startswith("pid ")
    True
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class FolderBusy(ValueError):
    """Another process holds the folder's lock (a usage error: the command says so in one line)."""


@contextlib.contextmanager
def folder_lock(folder: str | Path, lock_file: str, command: str, alternative: str) -> Iterator[None]:
    """Hold ``folder``'s lock (the file ``lock_file`` in it, the folder made if needed) for the block.

    Args:
        folder: The output folder.
        lock_file: The lock's file name in ``folder``.
        command: What writes the folder, for the refusal (``progpo train``).
        alternative: What the refused user may do instead, for the refusal (``give another --out``).

    Raises:
        FolderBusy: another process holds the lock.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / lock_file).open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise FolderBusy(
                f"{folder} is being written by another {command} ({holder}): wait for it to end, "
                f"or {alternative}"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock
