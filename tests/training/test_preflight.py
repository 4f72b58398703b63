"""Start-up checks (:mod:`training.preflight`): one line with the fix, before any model or env is built."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.training.training_helpers import REPO, subprocess_env
from training.config import ConfigError, load_config
from training.envs import data_dir_value
from training.preflight import preflight

ALFWORLD_PRESET = REPO / "configs" / "alfworld_progpo_qwen2.5-1.5b.yaml"


@pytest.fixture
def model_folder(tmp_path):
    """A model folder as far as the checks look: its config.json (Qwen2.5-1.5B's context)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    return folder


def test_the_alfworld_preset_without_alfworld_data_stops_in_one_line_before_loading_anything(
    tmp_path, model_folder
):
    env = {k: v for k, v in subprocess_env().items() if k != "ALFWORLD_DATA"}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "--config", str(ALFWORLD_PRESET), f"model.path={model_folder}",
         f"run_dir={run_dir}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ALFWORLD_DATA" in lines[0] and "env.data_dir=generated" in lines[0], lines
    assert not run_dir.exists()  # nothing was built: no run folder, no model, no env


def test_generated_games_are_asked_for_by_name(model_folder, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    preflight(load_config(ALFWORLD_PRESET, [f"model.path={model_folder}", "env.data_dir=generated"]))


def test_the_alfworld_preset_reads_its_data_folder_from_the_variable(tmp_path, model_folder, monkeypatch):
    for split in ("train", "valid_seen"):
        (tmp_path / "json_2.1.1" / split).mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    config = load_config(ALFWORLD_PRESET, [f"model.path={model_folder}"])
    preflight(config)
    assert data_dir_value(config.env.data_dir) == str(tmp_path)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not a folder"):
        preflight(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model.path=/nonexistent/Qwen2.5-1.5B-Instruct"],
            "is not a folder: give a transformers model folder",
        ),
        (["model.path=Qwen/Qwen2.5-1.5B-Instruct"], "nothing is downloaded at run time"),
        (["rollout.max_prompt_tokens=4000", "rollout.max_new_tokens=200"], "longer than the model's context"),
        (["env.data_dir=$PROGPO_TEST_UNSET_VARIABLE"], "PROGPO_TEST_UNSET_VARIABLE, which is not set"),
        (["env.train_split=trian"], "env.train_split is 'trian', which progpo/ALFWorld-v0 does not have"),
        (["env.eval_split=valid_sen"], r"env.eval_split is 'valid_sen'.*one of \['train', 'valid_seen'"),
    ],
)
def test_mistakes_a_new_machine_makes_are_one_line_each(overrides, message, monkeypatch):
    monkeypatch.delenv("PROGPO_TEST_UNSET_VARIABLE", raising=False)
    with pytest.raises(ConfigError, match=message) as raised:
        preflight(load_config(None, overrides))
    assert "\n" not in str(raised.value)


def test_a_real_data_folder_without_the_presets_training_split_is_named(tmp_path, model_folder, monkeypatch):
    """Real trials holding only valid_seen and valid_train (a subset): the preset's train split is missing."""
    for split in ("valid_seen", "valid_train"):
        (tmp_path / "json_2.1.1" / split).mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ConfigError, match=r"env.train_split is 'train'.*\['valid_seen', 'valid_train'\]"):
        preflight(load_config(ALFWORLD_PRESET, [f"model.path={model_folder}"]))
    preflight(load_config(ALFWORLD_PRESET, [f"model.path={model_folder}", "env.train_split=valid_train"]))


def test_the_model_folders_context_bounds_prompt_and_response(model_folder):
    (model_folder / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    config = load_config(None, [f"model.path={model_folder}", "rollout.max_prompt_tokens=1000"])
    with pytest.raises(ConfigError, match="1040 is longer than the model's context \\(1024 positions\\)"):
        preflight(config)
