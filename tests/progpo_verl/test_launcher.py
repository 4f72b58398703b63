"""``python -m progpo_verl.verl_agent``: its help and the Ray settings everywhere; the dry run (Hydra composes
the config, our env package is built and reset) in ``.venv-verl`` (``.ci/run_verl``), against the stand-in's
trainer config or, when ``PROGPO_TEST_VERL_AGENT_SRC`` names a verl-agent checkout, its real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import progpo_envs.testing  # noqa: F401  (registers agents-test/ToyALFWorld-v0 in this process)
from progpo_verl.verl_agent import __main__ as launcher
from progpo_verl.verl_agent.install import SETUP_HOOK

STANDIN_CONFIG = Path(__file__).parent / "standin" / "verl" / "trainer" / "config"
VERL_AGENT_SRC = "PROGPO_TEST_VERL_AGENT_SRC"


def test_help_lists_our_estimators_their_keys_and_our_envs():
    out = subprocess.run(
        [sys.executable, "-m", "progpo_verl.verl_agent", "--help"], capture_output=True, text=True, check=True
    ).stdout
    keys = {
        line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines() if line.startswith("  progpo")
    }
    assert {"progpo", "progpo_gigpo", "progpo_coverage"} <= set(keys)
    assert keys["progpo"].startswith("algorithm.progpo.{") and "step_weight" in keys["progpo"]
    assert "gamma" not in keys["progpo_gigpo"]  # algorithm.gamma sets it
    for text in (
        "--dry-run",
        "graphgpo",
        "algorithm.progpo_rows.duplicates=dedupe|count",
        "progpo/Remote-v0",
    ):
        assert text in out
    assert "docs/verl_agent.md" in out


def test_without_verl_agent_the_launcher_says_so(tmp_path):
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, "-m", "progpo_verl.verl_agent", "algorithm.adv_estimator=progpo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    if "verl" in sys.modules or out.returncode == 0:
        pytest.skip("a verl is installed here")
    assert out.returncode != 0 and ("no verl-agent here" in out.stderr or "is not verl-agent" in out.stderr)


def test_ray_is_started_with_our_hook_and_verl_agents_environment():
    config = {
        "ray_init": {
            "num_cpus": None,
            "runtime_env": {"worker_process_setup_hook": SETUP_HOOK, "env_vars": {"EXTRA": "1"}},
        }
    }
    kwargs = launcher.ray_init_kwargs(config)
    assert "num_cpus" not in kwargs  # None: Ray's default, as verl-agent passes it
    assert kwargs["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
    assert kwargs["runtime_env"]["env_vars"]["EXTRA"] == "1"
    assert kwargs["runtime_env"]["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"


@pytest.mark.verl
@pytest.mark.parametrize("estimator", ["progpo", "progpo_gigpo"])
def test_dry_run_composes_the_config_and_builds_our_envs(tmp_path, estimator):
    pytest.importorskip("hydra")
    out = tmp_path / "dry"
    status = launcher.main(
        [
            "--dry-run",
            "--config-dir",
            str(STANDIN_CONFIG),
            "--out",
            str(out),
            f"algorithm.adv_estimator={estimator}",
            "algorithm.gamma=0.95",
            f"algorithm.{estimator}.step_weight=0.5",
            "algorithm.progpo_rows.duplicates=count",
            "env.env_name=agents-test/ToyALFWorld-v0",
            "env.rollout.n=4",
            "env.max_steps=8",
            "data.train_batch_size=3",
            "data.val_batch_size=5",
            "env.progpo.kwargs={num_tasks:6}",
        ]
    )
    assert status == 0
    from omegaconf import OmegaConf

    config = OmegaConf.load(out / "config.yaml")
    assert config.ray_init.runtime_env.worker_process_setup_hook == SETUP_HOOK
    assert config.algorithm[estimator].step_weight == 0.5
    sample = json.loads((out / "env_sample.json").read_text())
    assert sample["estimator"]["params"] == {"step_weight": 0.5, "gamma": 0.95}
    assert sample["estimator"]["duplicates"] == "count" and sample["estimator"]["invalid_penalty"] == 0.1
    assert sample["envs"]["train"]["copies"] == 12 and sample["envs"]["val"]["copies"] == 5
    train_tasks = sample["envs"]["train"]["task_ids"]
    assert len(set(train_tasks[:4])) == 1  # a group's copies play one task
    assert (
        "<action>" in sample["envs"]["train"]["prompt"]
        and "Your task is to" in sample["envs"]["train"]["anchor"]
    )


@pytest.mark.verl
def test_a_bad_estimator_parameter_stops_the_launcher(tmp_path, capsys):
    pytest.importorskip("hydra")
    status = launcher.main(
        [
            "--dry-run",
            "--config-dir",
            str(STANDIN_CONFIG),
            "--out",
            str(tmp_path),
            "algorithm.adv_estimator=progpo",
            "algorithm.progpo.step_weigth=0.5",
            "env.env_name=agents-test/ToyALFWorld-v0",
            "data.train_batch_size=1",
            "data.val_batch_size=1",
        ]
    )
    assert status == 2 and "unknown parameter(s) ['step_weigth']" in capsys.readouterr().err


@pytest.mark.verl
def test_dry_run_on_verl_agents_own_config(tmp_path):
    """verl-agent's real ppo_trainer.yaml (a checkout named by PROGPO_TEST_VERL_AGENT_SRC) with a recipe's
    overrides and our real ALFWorld env (generated games)."""
    pytest.importorskip("hydra")
    source = Path(os.environ.get(VERL_AGENT_SRC, "/nonexistent"))
    if not (source / "verl" / "trainer" / "config" / "ppo_trainer.yaml").is_file():
        pytest.skip(f"set {VERL_AGENT_SRC} to a verl-agent checkout")
    status = launcher.main(
        [
            "--dry-run",
            "--config-dir",
            str(source / "verl" / "trainer" / "config"),
            "--out",
            str(tmp_path),
            "algorithm.adv_estimator=progpo",
            "algorithm.gamma=0.95",
            "env.env_name=progpo/ALFWorld-v0",
            "env.rollout.n=2",
            "env.max_steps=50",
            "data.train_batch_size=2",
            "data.val_batch_size=2",
            "actor_rollout_ref.actor.invalid_action_penalty_coef=0.1",
            "env.progpo.kwargs={task_types:[pick_and_place_simple,look_at_obj_in_light],scenes:[304,316,328,329]}",
            "env.progpo.train_kwargs={num_generated:4}",
        ]
    )
    assert status == 0
    sample = json.loads((tmp_path / "env_sample.json").read_text())
    assert sample["env"]["env"]["eval_split"] == "valid_seen" and sample["envs"]["train"]["copies"] == 4
