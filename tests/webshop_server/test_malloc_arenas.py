"""A server process caps glibc's malloc arenas (``webshop_server.serving.limit_malloc_arenas``), unless the
operator set ``MALLOC_ARENA_MAX`` (the effect on a server's memory: ``benchmarks/soak.py``'s
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
