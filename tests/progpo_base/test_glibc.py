"""``progpo_base.glibc.release_library_pages``: a loaded library's file pages leave the resident set, and the
library runs as before once they come back (as an ALFWorld worker's idle planner copies do)."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import sys
import zlib
from pathlib import Path

import pytest

from progpo_base import glibc
from progpo_base.glibc import release_library_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise")


def _resident_bytes(path: Path) -> dict[str, int]:
    """The resident bytes of the mappings of the file loaded from ``path``, by their permissions."""
    resident: dict[str, int] = {}
    perms = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields[0].endswith(":"):
                if perms and fields[0] == "Rss:":
                    resident[perms] = resident.get(perms, 0) + int(fields[1]) * 1024
            else:  # a mapping's header
                perms = fields[1] if str(path) in line else None
    return resident


def _file_mapped_at(address: int) -> Path:
    with open("/proc/self/maps") as maps:
        for line in maps:
            bounds, *_, path = line.split()
            start, end = (int(bound, 16) for bound in bounds.split("-"))
            if start <= address < end:
                return Path(path)
    raise LookupError(hex(address))


@pytest.fixture
def zlib_copy(tmp_path):
    """A copy of the system's zlib loaded from a file of its own, deleted once loaded (as the planner
    package loads its copies)."""
    name = ctypes.util.find_library("z")
    if name is None:
        pytest.skip("no shared zlib on this system")
    source = _file_mapped_at(ctypes.cast(ctypes.CDLL(name).crc32, ctypes.c_void_p).value)
    path = tmp_path / "libz-copy.so"
    shutil.copyfile(source, path)
    library = ctypes.CDLL(str(path))
    path.unlink()
    library.crc32.argtypes, library.crc32.restype = (
        [ctypes.c_ulong, ctypes.c_char_p, ctypes.c_uint],
        ctypes.c_ulong,
    )
    return path, library


def test_a_library_s_code_leaves_the_resident_set_and_runs_again(zlib_copy):
    path, library = zlib_copy
    data = b"the same bytes, before and after" * 1000
    assert library.crc32(0, data, len(data)) == zlib.crc32(data)
    before = _resident_bytes(path)
    assert before["r-xp"] > 0

    released = release_library_pages(ctypes.cast(library.crc32, ctypes.c_void_p).value)

    after = _resident_bytes(path)
    assert released >= before["r-xp"] > after["r-xp"]
    assert after.get("rw-p") == before.get("rw-p")  # its data stays
    assert library.crc32(0, data, len(data)) == zlib.crc32(data)  # the code, read back from the deleted file
    assert _resident_bytes(path)["r-xp"] > after["r-xp"]


def test_memory_of_no_file_is_left_alone():
    buffer = ctypes.create_string_buffer(b"x" * 65536)
    assert release_library_pages(ctypes.addressof(buffer)) == 0
    assert buffer.raw[:4] == b"xxxx"
    assert release_library_pages(0) == 0  # no mapping holds it


def test_without_smaps_nothing_is_released(zlib_copy, monkeypatch):
    path, library = zlib_copy

    def unreadable():
        raise PermissionError("/proc/self/smaps")

    monkeypatch.setattr(glibc, "_smaps", unreadable)
    before = _resident_bytes(path)["r-xp"]
    assert release_library_pages(ctypes.cast(library.crc32, ctypes.c_void_p).value) == 0
    assert _resident_bytes(path)["r-xp"] == before
