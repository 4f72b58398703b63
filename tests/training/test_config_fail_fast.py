"""``progpo train`` with a mistyped estimator or parameter exits at once, through the real command, with
and without the GPU presets: no run folder, env or model is made, and the message names the valid choices."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from tests.training.training_helpers import subprocess_env

CONFIGS = REPO_ROOT / "configs"


def _progpo() -> list[str]:
    script = shutil.which("progpo", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "progpo.cli"]


@pytest.mark.parametrize(
    "preset", [None, "alfworld_progpo_qwen2.5-1.5b.yaml", "webshop_progpo_qwen2.5-1.5b.yaml"]
)
@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.name=grop", "valid: dapo, g2po, gigpo, graphgpo, grpo, progpo, progpo_coverage, rloo"),
        (
            "algo.params={gama: 0.9}",
            "unknown parameter(s) ['gama']; allowed: ['stats_scope', 'norm', 'eps', 'gamma', 'step_weight'",
        ),
    ],
)
def test_typos_exit_before_anything_is_built(tmp_path, preset, override, message):
    run_dir = tmp_path / "run"
    config = ["--config", str(CONFIGS / preset)] if preset else []
    done = subprocess.run(
        [*_progpo(), "train", *config, override, f"run_dir={run_dir}"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one line
    assert not run_dir.exists()  # the trainer never started: no config.yaml, no tiny policy, no envs


def test_help_names_dapos_recipe_and_help_config_lists_the_estimators():
    help_text = subprocess.run(
        [*_progpo(), "train", "--help"], env=subprocess_env(), capture_output=True, text=True, timeout=120
    ).stdout
    assert "loss.clip_high=0.28" in help_text and "rollout.dynamic_sampling=True" in help_text
    listing = subprocess.run(
        [*_progpo(), "train", "--help-config"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = dict(
        line.split(None, 1)
        for line in listing.split("algo.params keys each accepts:")[1].splitlines()
        if line
    )
    assert rows["grpo"] == "stats_scope, norm, eps"
    assert "gamma" in rows["progpo"] and set(rows) >= {"dapo", "gigpo", "progpo_coverage", "rloo"}
