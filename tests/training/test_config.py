"""Configuration: defaults = quickstart, YAML presets, overrides, unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import ALGO_CHOICES, ConfigError, config_from_dict, config_to_dict, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_embedded_defaults_are_the_quickstart_preset():
    assert config_to_dict(load_config(CONFIGS / "quickstart.yaml")) == config_to_dict(load_config(None))


@pytest.mark.parametrize(
    "name", ["quickstart.yaml", "alfworld_progpo_qwen2.5-1.5b.yaml", "webshop_progpo_qwen2.5-1.5b.yaml"]
)
def test_presets_load(name):
    config = load_config(CONFIGS / name)
    assert config.algo.name == "progpo"
    assert config_from_dict(config_to_dict(config)) == config


def test_paper_recipe_in_gpu_presets():
    alf = load_config(CONFIGS / "alfworld_progpo_qwen2.5-1.5b.yaml")
    web = load_config(CONFIGS / "webshop_progpo_qwen2.5-1.5b.yaml")
    for cfg in (alf, web):
        assert (cfg.rollout.num_groups, cfg.rollout.group_size, cfg.rollout.history_length) == (16, 8, 2)
        assert (cfg.optim.lr, cfg.loss.clip_low, cfg.loss.dual_clip, cfg.loss.kl_coef) == (
            1e-6,
            0.2,
            3.0,
            0.01,
        )
        assert (cfg.rollout.temperature, cfg.eval.temperature, cfg.algo.invalid_penalty) == (1.0, 0.4, 0.1)
        assert cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (alf.env.max_steps, web.env.max_steps) == (50, 15)
    assert (alf.optim.mini_batch_rows, web.optim.mini_batch_rows) == (256, 64)


def test_overrides_are_typed():
    cfg = load_config(
        None,
        [
            "optim.lr=1e-5",
            "rollout.group_size=8",
            "algo.params={gamma: 0.9}",
            "model.lora_target_modules=[q_proj]",
            "env.kwargs.num_generated=12",
        ],
    )
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.rollout.group_size == 8
    assert cfg.algo.params == {"gamma": 0.9}
    assert cfg.model.lora_target_modules == ["q_proj"]
    assert cfg.env.kwargs == {"num_generated": 12}


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_sise=4", "unknown key 'rollout.group_sise'"),
        ("nonsense=1", "unknown key 'nonsense'"),
        ("rollout.group_size=four", "must be an integer"),
        ("tensorboard=1", "true or false"),
        ("rollout.engine=tgi", "engine"),
        ("no_equals_sign", "key=value"),
    ],
)
def test_bad_overrides_are_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_unknown_key_in_yaml_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  group_size: 4\n  temprature: 1.0\n")
    with pytest.raises(ConfigError, match="rollout.temprature"):
        load_config(path)


def test_every_algo_choice_is_a_registered_estimator():
    from training.advantages import ESTIMATORS

    assert set(ALGO_CHOICES) <= set(ESTIMATORS)
