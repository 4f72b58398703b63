"""A server process caps glibc's malloc arenas (``webshop_server.serving.limit_malloc_arenas``), unless the
operator set ``MALLOC_ARENA_MAX``, and an env worker hands its heap's free pages back
(``webshop_server.serving.HeapTrimmer``) (the effect on their memory: ``benchmarks/soak.py``'s
``rss_growth``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import repo_on_pythonpath

CAP = "from webshop_server.serving import limit_malloc_arenas; print(limit_malloc_arenas())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("operator, capped", [(None, "True"), ("4", "False")])
def test_a_server_caps_its_malloc_arenas_unless_the_operator_chose(operator, capped):
    env = {k: v for k, v in repo_on_pythonpath().items() if k != "MALLOC_ARENA_MAX"}
    if operator is not None:
        env["MALLOC_ARENA_MAX"] = operator
    answer = subprocess.run([sys.executable, "-c", CAP], env=env, capture_output=True, text=True, timeout=60)
    assert answer.stdout.strip() == capped, answer.stderr


#: Frees 64 MiB of 64 KiB blocks below one block kept at the heap's top (so free() alone cannot shrink the
#: heap: what a worker's heap looks like after a big planner task was freed), then ticks a trimmer.
TRIM = """
import ctypes, psutil
from webshop_server.serving import HeapTrimmer
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(1 << 16) for _ in range(1024)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 16)
top = libc.malloc(1 << 16)
ctypes.memset(top, 1, 1 << 16)
for block in blocks:
    libc.free(block)
rss = lambda: psutil.Process().memory_info().rss
trimmer = HeapTrimmer(interval_s=3600.0)
before = rss()
early = trimmer.tick()
trimmer.interval_s = 0.0
print(early, trimmer.tick(), before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_heap_trimmer_hands_free_heap_pages_back_once_its_interval_passed():
    answer = subprocess.run(
        [sys.executable, "-c", TRIM], env=repo_on_pythonpath(), capture_output=True, text=True, timeout=60
    )
    early, trimmed, released = answer.stdout.split()
    assert (early, trimmed) == ("False", "True"), answer.stderr
    assert int(released) > 32 << 20  # most of the 64 MiB freed in the middle of the heap
