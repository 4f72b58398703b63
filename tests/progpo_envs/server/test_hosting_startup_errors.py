"""A server that cannot start says why in one line, with the fix, instead of a traceback: a missing ALFWorld
split, a full disk, a read-only cache that is not complete, a damaged search index or cached catalog, a port
in use (on both doors, before the env workers start)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as REPO


def run(command: list[str], **env: str) -> tuple[int, list[str]]:
    """Run a server command that should fail at start; its exit status and stderr lines."""
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_a_missing_alfworld_split_is_one_line_with_the_choice(tmp_path):
    """Before: a 20-line traceback ending in FileNotFoundError from the env worker."""
    from progpo_envs.alfworld.data import load_tasks

    trial = load_tasks("train", num_generated=6)[0]  # the small set the ALFWorld tests generate too
    data = tmp_path / "data"
    shutil.copytree(trial.trial_dir, data / "json_2.1.1" / "valid_seen" / trial.task_id)
    status, lines = run(["progpo_envs.server.cli", "--env", "progpo/ALFWorld-v0"], ALFWORLD_DATA=str(data))
    assert status == 2 and len(lines) == 1, lines
    assert "no split 'train'" in lines[0] and "it has: valid_seen" in lines[0]
    assert """--env-kwargs 'progpo/ALFWorld-v0={"split": "valid_seen"}'""" in lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ["webshop_server.cli", "serve", "--num-products", "100"],
        [
            "progpo_envs.server.cli",
            "--env",
            "progpo/WebShop-v0",
            "--env-kwargs",
            'progpo/WebShop-v0={"num_products": 100}',
            "--port",
            "0",  # the port is bound before the env workers start: the test needs no free port 8000
        ],
    ],
    ids=["site", "env-server"],
)
def test_a_read_only_incomplete_cache_is_one_line(tmp_path, read_only, command):
    (tmp_path / "cache").mkdir()
    cache = read_only(tmp_path / "cache")
    status, lines = run(command, PROGPO_CACHE=str(cache))
    assert status == 2 and len(lines) == 1, lines
    assert "cannot write" in lines[0] and "PROGPO_CACHE" in lines[0]


def test_a_full_disk_is_one_line(small_disk):
    """Before: an OSError traceback (ENOSPC) while the catalog or index was written."""
    cache = small_disk("1m")
    status, lines = run(["webshop_server.cli", "serve", "--num-products", "1000"], PROGPO_CACHE=str(cache))
    assert status == 2 and len(lines) == 1, lines
    assert "no space left on the device" in lines[0] and "PROGPO_CACHE" in lines[0]


def _built_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    build = "from webshop_server.engine import WebShopEngine; WebShopEngine.shared(100, 0)"
    subprocess.run(
        [sys.executable, "-c", build], cwd=REPO, env={**os.environ, "PROGPO_CACHE": str(cache)}, check=True
    )
    return cache


def test_a_damaged_search_index_is_one_line_saying_to_delete_it(tmp_path):
    cache = _built_cache(tmp_path)
    [index] = (cache / "webshop" / "index").glob("*-v*")
    (index / "meta.json").write_text("{not json")
    status, lines = run(["webshop_server.cli", "serve", "--num-products", "100"], PROGPO_CACHE=str(cache))
    assert status == 2 and len(lines) == 1, lines
    assert f"the search index {index} is damaged" in lines[0] and f"delete {index}" in lines[0]


def test_a_damaged_cached_catalog_is_one_line_saying_to_delete_it(tmp_path):
    cache = _built_cache(tmp_path)
    [catalog] = (cache / "webshop").glob("catalog-v*/100-0")
    items = next(catalog.glob("items_shuffle*.json"))
    items.write_text(items.read_text()[: len(items.read_text()) // 2])
    status, lines = run(["webshop_server.cli", "serve", "--num-products", "100"], PROGPO_CACHE=str(cache))
    assert status == 2 and len(lines) == 1, lines
    assert f"the cached catalog {catalog} is damaged" in lines[0] and f"delete {catalog}" in lines[0]


@pytest.mark.parametrize("protocol", ["native", "openenv"])
def test_a_port_in_use_is_one_line_naming_it_and_the_fix_on_both_doors(protocol):
    """Issue 39, item 3. Before: a 27-line traceback ending in ``OSError: [Errno 98] Address already in use``
    (the OpenEnv door after its env workers had started, ~32 s on a loaded machine), exit status 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        status, lines = run(["progpo.cli", "serve", "--protocol", protocol, "--port", str(port)])
        seconds = time.monotonic() - started
    assert status == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"progpo serve: error: port {port} on 127.0.0.1 is in use (another server listens there): stop that "
        "server, or give another --port (--port 0 picks a free one)"
    )
    assert seconds < 10, seconds  # the bound: the port is checked before the slow start-up
