"""The processes a benchmark watches: a process and its children, their CPU time, and a sampler that reads
them on a period while the measurement runs.

Example:
    >>> import os
    >>> [p.pid for p in tree(os.getpid())][:1] == [os.getpid()], cpu_seconds(tree(os.getpid())) > 0
    (True, True)
    >>> with Sampler(lambda: None, 0.01) as sampler:
    ...     pass
    >>> sampler.samples >= 1
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import psutil


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants ([] when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(processes: Iterable[psutil.Process]) -> float:
    """User + system CPU seconds of ``processes`` so far (those that ended count 0)."""
    total = 0.0
    for process in processes:
        try:
            total += sum(process.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of the process ``pid`` and its descendants now."""
    total = 0
    for process in tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class Sampler:
    """Calls ``sample()`` in a thread at once and every ``period_s`` seconds, from :meth:`start` (or entry)
    until :meth:`stop` (or exit)."""

    def __init__(self, sample: Callable[[], None], period_s: float):
        self.sample, self.period_s, self.samples = sample, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.sample()
            self.samples += 1
            if self._stop.wait(self.period_s):
                return

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
