"""The benchmarks' shared helpers: result files, the commit, and a server process that fails loudly."""

from __future__ import annotations

import json
import re
import sys

import psutil
import pytest

from benchmarks.common import ServerProcess, free_port, git_commit, machine_info, save_result


def test_machine_info_keeps_each_benchmarks_extra_keys_after_the_common_ones():
    info = machine_info(load_avg_1m=0.5, torch="2.0")
    common = ["cpu_model", "cpu_flags", "cpu_count", "python", "platform", "torch_build", "packages", "git"]
    assert list(info) == [*common, "load_avg_1m", "torch"]  # the record every training run keeps, then extras
    assert info["load_avg_1m"] == 0.5 and re.fullmatch(r"\d+\.\d+\.\d+\S*", info["python"])


def test_save_result_makes_the_folder_and_writes_indented_json(tmp_path):
    path = save_result({"benchmark": "x", "rows": [1, 2]}, tmp_path / "new" / "x.json")
    assert json.loads(path.read_text()) == {"benchmark": "x", "rows": [1, 2]}
    assert path.read_text().startswith('{\n  "benchmark"') and path.read_text().endswith("\n")


def test_git_commit_names_this_checkouts_head():
    commit = git_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", commit["commit"]) and isinstance(commit["dirty"], bool)


def test_a_server_that_exits_is_reported_with_its_output():
    command = [sys.executable, "-c", "print('cannot bind: config missing'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)exited \(rc 3\).*cannot bind: config missing"):
        ServerProcess(command, free_port(), ready_path="/ready")


def test_a_server_never_ready_is_stopped_and_reported():
    command = [sys.executable, "-c", "import time; print('still loading', flush=True); time.sleep(120)"]
    earlier = {p.pid for p in psutil.Process().children()}  # other tests' session-wide servers stay
    with pytest.raises(RuntimeError, match=r"(?s)not ready after 8 s.*still loading"):
        ServerProcess(command, free_port(), ready_path="/ready", timeout_s=8.0)
    left = [p for p in psutil.Process().children() if p.pid not in earlier]
    assert not [p for p in left if p.is_running() and p.status() != "zombie"]
