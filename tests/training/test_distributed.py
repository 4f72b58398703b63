"""FSDP2 (``fully_shard``) over gloo: a 2-process ``torchrun`` run of the whole loop on CPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env, torchrun_train

CONFIGS = REPO_ROOT / "configs"


def _command(run_dir: Path, *extra: str) -> list[str]:
    return torchrun_train(CONFIGS / "quickstart.yaml", *TINY_OVERRIDES, f"run_dir={run_dir}", *extra)


@pytest.mark.parametrize(
    "rollout",
    [
        pytest.param([], id="lockstep"),
        # each rank's episodes at their own pace on its own engine loop, the next batch during the update
        pytest.param(["rollout.mode=async", "rollout.max_staleness=1"], id="async", marks=pytest.mark.slow),
    ],
)
def test_two_process_fsdp2_run(tmp_path, rollout):
    command = _command(
        tmp_path, "iterations=2", "checkpoint_every=1", "rollout.task_pool=3", "eval.rl_tasks=true", *rollout
    )
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2]
    # 2 groups split over 2 ranks, gathered back: every episode is counted once
    assert all(r["episodes"] == 4 for r in train)
    assert all(abs(r["first_ratio_mean"] - 1.0) < 1e-3 for r in train)
    assert all(r["staleness_max"] <= (1 if rollout else 0) for r in train)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == 2
    # the RL task pool's 3 tasks are split 2 + 1 over the ranks and every episode is gathered once
    assert summary["rl_tasks_before_rl"]["episodes"] == summary["rl_tasks_after_rl"]["episodes"] == 3
    assert (tmp_path / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_process_fsdp2_resume(tmp_path):
    """Sharded model and optimizer state go through the full-state checkpoint and back on resume."""
    command = _command(tmp_path, "iterations=1", "checkpoint_every=1")
    assert subprocess.run(command, env=subprocess_env(), capture_output=True, timeout=420).returncode == 0
    resumed = subprocess.run(
        [*command[:-2], "iterations=2", "checkpoint_every=1", "--resume"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1, 2]
