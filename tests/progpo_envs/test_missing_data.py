"""A data folder that does not exist, named by ``ALFWORLD_DATA`` or ``WEBSHOP_DATA``, through the real
commands (issue 39, item 7): one line saying it does not exist and what to do, exit status 2, and the folder
is not created (before: ``import alfworld`` created the ALFWorld folder empty before the refusal, and the
WebShop folder was called "damaged")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as REPO


def _progpo(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("ALFWORLD_DATA", "WEBSHOP_DATA")}
    environment.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "progpo.cli", *argv],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "--env", "progpo/ALFWorld-v0", "--agent", "expert", "--episodes", "1", "--out", "out"],
        ["serve", "--port", "0"],
        ["train", "--run-dir", "run", "iterations=0"],
    ],
    ids=["eval", "serve", "train"],
)
def test_a_missing_alfworld_data_folder_is_said_and_not_created(tmp_path, command):
    missing = tmp_path / "nonexistent" / "alfworld"
    done = _progpo(tmp_path, *command, ALFWORLD_DATA=str(missing))
    assert done.returncode == 2, done.stderr
    prog = f"progpo {command[0]}: error: "
    where = "progpo/ALFWorld-v0: " if command[0] == "serve" else ""
    assert done.stderr == (
        f"{prog}{where}the ALFWorld data folder {missing} (ALFWORLD_DATA) does not exist: give the folder "
        "that contains json_2.1.1/, or unset ALFWORLD_DATA for the generated games\n"
    )
    assert not (tmp_path / "nonexistent").exists()  # before: created, empty
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_a_missing_webshop_data_folder_is_called_missing_with_the_fix(tmp_path):
    missing = tmp_path / "nonexistent" / "webshop"
    argv = ["eval", "--env", "progpo/WebShop-v0", "--agent", "random", "--episodes", "1", "--out", "out"]
    done = _progpo(tmp_path, *argv, WEBSHOP_DATA=str(missing))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "damaged" not in done.stderr
    assert done.stderr.startswith(
        f"progpo eval: error: the WebShop data folder {missing} (WEBSHOP_DATA) does not exist: point "
        "WEBSHOP_DATA at the folder holding WebShop's items_shuffle.json, items_ins_v2.json, "
        "items_human_ins.json"
    )
    assert "or unset WEBSHOP_DATA for the generated catalog" in done.stderr
    assert not (tmp_path / "nonexistent").exists()
