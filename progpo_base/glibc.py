"""What long-lived processes ask of glibc and Linux about their memory.

* :func:`glibc_function`: a glibc function with its argument types set, or ``None`` on another platform (the
  servers' ``mallopt`` and ``malloc_trim``: ``webshop_server.serving``);
* :func:`release_library_pages`: the pages of a loaded library that its file still holds, out of the
  process's resident set until they are used again (an ALFWorld worker's idle planner copies:
  ``progpo_envs.alfworld.engine``).
"""

from __future__ import annotations

import ctypes
import re
import sys
from typing import Any

#: ``madvise``'s advice that unmaps a range's pages (``<sys/mman.h>``): a private file mapping's pages are
#: read again from the file at their next use, its anonymous (copied-on-write) pages are lost.
MADV_DONTNEED = 4
#: A mapping's header line in ``/proc/self/smaps``: ``start-end perms offset device inode [path]``.
_MAPPING_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ (\S+) (\d+)")


def glibc_function(name: str, argtypes: list) -> Any:
    """glibc's function ``name`` with its argument types set (returning an int), or ``None`` on another
    platform or C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


def release_library_pages(address: int) -> int:
    """Take out of this process's resident set the pages of the library mapped at ``address`` that are the
    file's own (its code and constants); the bytes they held (0 on another platform).

    Only the library's mappings that are read-only and hold no page of their own (``Anonymous: 0`` in
    ``/proc/self/smaps``: the relocated tables and the data are such pages) are advised ``MADV_DONTNEED``:
    their next use reads the same bytes back from the file (or the page cache), also when the file was deleted
    after loading, because the mapping keeps it open. The caller must not run code of the library meanwhile
    (an idle copy). The mappings of the library are found by the device and inode of the one holding
    ``address``, not by path: a deleted file's path may name another file by now. Where the process cannot
    read its ``/proc/self/smaps``, nothing is released.
    """
    madvise = glibc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
    if madvise is None:
        return 0
    try:
        mappings = _smaps()
    except OSError:  # a sandbox without /proc/self/smaps: the pages stay, as they would elsewhere
        return 0
    owner = next((m for m in mappings if m["start"] <= address < m["end"]), None)
    if owner is None or owner["inode"] == "0":
        return 0
    released = 0
    for mapping in mappings:
        if (mapping["device"], mapping["inode"]) != (owner["device"], owner["inode"]):
            continue
        if "w" in mapping["perms"] or mapping["Anonymous"] != 0:
            continue
        if madvise(mapping["start"], mapping["end"] - mapping["start"], MADV_DONTNEED) == 0:
            released += mapping["Rss"]
    return released


def _smaps() -> list[dict[str, Any]]:
    """This process's mappings (``/proc/self/smaps``): ``start``, ``end``, ``perms``, ``device``, ``inode``
    and the ``Rss`` and ``Anonymous`` bytes of each."""
    mappings: list[dict[str, Any]] = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            header = _MAPPING_HEADER.match(line)
            if header:
                start, end, perms, device, inode = header.groups()
                bounds = {"start": int(start, 16), "end": int(end, 16)}
                mappings.append({**bounds, "perms": perms, "device": device, "inode": inode})
                continue
            fields = line.split()
            if fields and fields[0] in ("Rss:", "Anonymous:") and mappings:
                mappings[-1][fields[0][:-1]] = int(fields[1]) * 1024
    return mappings
