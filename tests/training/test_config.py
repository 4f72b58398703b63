"""Configuration: neutral defaults, the quickstart preset when no file is given, YAML presets, overrides,
unknown keys."""

from __future__ import annotations

import pytest

from tests.paths import REPO_ROOT
from training.config import (
    DAPO_RECIPE,
    ENV_SPECIFIC_KEYS,
    QUICKSTART,
    ConfigError,
    TrainConfig,
    algo_choices,
    algo_parameters,
    config_from_dict,
    config_to_dict,
    load_config,
)

CONFIGS = REPO_ROOT / "configs"


def _leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("kwargs", "train_kwargs", "params"):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_no_file_is_the_quickstart_preset():
    assert QUICKSTART == CONFIGS / "quickstart.yaml"
    assert config_to_dict(load_config(CONFIGS / "quickstart.yaml")) == config_to_dict(load_config(None))


def test_defaults_are_neutral_and_the_quickstart_adds_only_its_alfworld_recipe():
    defaults, quickstart = _leaves(config_to_dict(TrainConfig())), _leaves(config_to_dict(load_config(None)))
    assert defaults["env.kwargs"] == {} and defaults["env.train_kwargs"] == {}
    differ = sorted(key for key in defaults if defaults[key] != quickstart[key])
    assert differ == sorted(ENV_SPECIFIC_KEYS)  # the rest of the preset restates the defaults
    assert quickstart["env.kwargs"] == {
        "task_types": ["pick_and_place_simple", "look_at_obj_in_light"],
        "scenes": [304, 316, 328, 329],
    }
    assert quickstart["env.train_kwargs"] == {"num_generated": 160, "expert_mode": "searching"}


def test_a_presets_env_kwargs_stay_with_its_env():
    quickstart = load_config(None)
    assert load_config(None, ["env.id=progpo/ALFWorld-v0"]).env == quickstart.env  # the same env: kept
    other = load_config(None, ["env.id=progpo/WebShop-v0", "env.train_kwargs.num_products=200"])
    assert other.env.kwargs == {} and other.env.train_kwargs == {"num_products": 200}  # only the command's
    assert other.env.max_steps == quickstart.env.max_steps  # generic env settings stay
    webshop = load_config(CONFIGS / "webshop_progpo_qwen2.5-1.5b.yaml", ["env.id=progpo/WebShop-v0"])
    assert webshop == load_config(CONFIGS / "webshop_progpo_qwen2.5-1.5b.yaml")


@pytest.mark.parametrize(
    "name",
    [
        "quickstart.yaml",
        "alfworld_progpo_qwen2.5-1.5b.yaml",
        "webshop_progpo_qwen2.5-1.5b.yaml",
        "finetune_smollm2.yaml",
    ],
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


def test_the_fine_tuning_preset_is_the_quickstarts_env_with_a_pretrained_models_settings():
    """configs/finetune_smollm2.yaml: a pretrained model, a fine-tuning rate (1e-6..1e-5, not the quickstart's
    3e-4 for random weights), a KL term to the starting model, no warm start, on the quickstart's ALFWorld."""
    tune, quickstart = load_config(CONFIGS / "finetune_smollm2.yaml"), load_config(None)
    assert tune.model.path and tune.model.gradient_checkpointing and not tune.warm_start.enabled
    assert 1e-6 <= tune.optim.lr <= 1e-5 < quickstart.optim.lr and tune.loss.kl_coef > 0
    assert (tune.env.id, tune.env.kwargs, tune.env.max_steps) == (
        quickstart.env.id,
        quickstart.env.kwargs,
        quickstart.env.max_steps,
    )
    assert tune.rollout.constrained_actions and tune.rollout.template == "default"


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
    assert cfg.env.kwargs == {**load_config(None).env.kwargs, "num_generated": 12}  # into the preset's dict


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_sise=4", "unknown key 'rollout.group_sise'"),
        ("nonsense=1", "unknown key 'nonsense'"),
        ("rollout.group_size=four", "must be an integer"),
        ("tensorboard=1", "true or false"),
        ("rollout.engine=tgi", "engine"),
        ("no_equals_sign", "key=value"),
        ("rollout.mode=pipelined", "rollout.mode must be one of lockstep, async"),
        ("rollout.max_staleness=-1", "rollout.max_staleness must be >= 0"),
        ("rollout.max_staleness=1", "needs rollout.mode=async"),  # lock step never overlaps the update
        ("loss.behaviour_weight_cap=0.5", "loss.behaviour_weight_cap must be >= 1"),
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


def test_algo_choices_are_the_registry():
    import dataclasses

    from training.advantages import ESTIMATORS, SharedParams, register_estimator

    assert algo_choices() == sorted(ESTIMATORS)
    assert "gamma" in algo_parameters("progpo") and "invalid_penalty" not in algo_parameters("progpo")

    @dataclasses.dataclass(frozen=True)
    class SpreadParams(SharedParams):
        spread: float = 1.0

    @register_estimator("test_only_estimator", params=SpreadParams)
    def _estimator(batch, params):
        raise NotImplementedError

    try:  # a newly registered estimator and its parameters are valid without touching the config
        config = load_config(None, ["algo.name=test_only_estimator", "algo.params={spread: 2.0}"])
        assert config.algo.params == {"spread": 2.0}
        with pytest.raises(ConfigError, match="test_only_estimator"):
            load_config(None, ["algo.name=test_only_estimator", "algo.params={gamma: 2.0}"])
    finally:
        del ESTIMATORS["test_only_estimator"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.name=grop"], "algo.name 'grop' is not a registered estimator; valid: dapo, g2po, gigpo"),
        (["algo.params={gama: 0.9}"], r"algo.params: estimator 'progpo': unknown parameter\(s\) \['gama'\]"),
        (["algo.name=grpo", "algo.params={gamma: 0.9}"], "allowed: .'stats_scope', 'norm', 'eps'.$"),
        (["algo.params={invalid_penalty: 0.2}"], "set algo.invalid_penalty instead"),
    ],
)
def test_algo_typos_fail_at_load_time_naming_the_valid_choices(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)
    for preset in ("alfworld_progpo_qwen2.5-1.5b.yaml", "webshop_progpo_qwen2.5-1.5b.yaml"):
        with pytest.raises(ConfigError, match=message):
            load_config(CONFIGS / preset, overrides)


def test_dapo_means_dapos_recipe_unless_set_on_the_command_line(tmp_path):
    recipe = lambda c: (c.loss.clip_high, c.rollout.dynamic_sampling, c.loss.exclude_uniform_groups)  # noqa: E731
    assert recipe(load_config(None)) == (0.2, False, False)
    assert tuple(DAPO_RECIPE.values()) == (0.28, True, True)
    assert recipe(load_config(None, ["algo.name=dapo"])) == (0.28, True, True)
    # a preset that sets clip_high 0.2 for progpo: --algo dapo still means DAPO's clip-higher
    preset = CONFIGS / "alfworld_progpo_qwen2.5-1.5b.yaml"
    assert recipe(load_config(preset, ["algo.name=dapo"])) == (0.28, True, True)
    overridden = load_config(
        preset, ["algo.name=dapo", "loss.clip_high=0.25", "rollout.dynamic_sampling=false"]
    )
    assert recipe(overridden) == (0.25, False, True)
    # a file that selects dapo itself keeps the values it sets
    own = tmp_path / "dapo.yaml"
    own.write_text("algo:\n  name: dapo\nloss:\n  clip_high: 0.3\n")
    assert recipe(load_config(own)) == (0.3, True, True)
    # a stored config (checkpoint, config.yaml) is taken as it is
    stored = config_to_dict(load_config(None, ["algo.name=dapo", "rollout.dynamic_sampling=false"]))
    assert recipe(config_from_dict(stored)) == (0.28, False, True)


def test_precision_fields():
    quick = load_config(None)
    assert (quick.model.dtype, quick.model.compute_dtype, quick.model.export_dtype) == (
        "float32",
        "auto",
        "auto",
    )
    for preset in ("alfworld_progpo_qwen2.5-1.5b.yaml", "webshop_progpo_qwen2.5-1.5b.yaml"):
        model = load_config(CONFIGS / preset).model
        assert (model.dtype, model.compute_dtype, model.export_dtype) == ("float32", "bfloat16", "bfloat16")
    with pytest.raises(ConfigError, match="model.compute_dtype=auto.bfloat16.float16.float32"):
        load_config(None, ["model.dtype=auto"])
    for key in ("model.dtype=float64", "model.compute_dtype=int8", "model.export_dtype=fp8"):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            load_config(None, [key])
    assert load_config(None, ["model.export_dtype=bfloat16"]).model.export_dtype == "bfloat16"


@pytest.mark.parametrize("override", ["rollout.vllm_gpu_memory_utilization=0", "optim.logit_chunk_tokens=-1"])
def test_memory_fields_are_checked(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])
