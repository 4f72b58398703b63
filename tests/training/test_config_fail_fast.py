"""``progpo train`` with a mistyped estimator or parameter, or a numeric key out of its range, exits at once,
through the real command, with and without the GPU presets: no run folder, env or model is made, and the
message names the key and the valid choices or range."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
import typing
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


# -- every numeric key is bounds-checked before anything is built (issue 39, item 5) ------------------------


def _numeric_keys(cls: type = None, prefix: str = "") -> list[tuple[str, dataclasses.Field, type]]:
    """``(dotted key, field, item type)`` of every numeric key of :class:`TrainConfig`, read from the config
    dataclasses themselves (so a key added without bounds fails :func:`test_every_numeric_key_has_bounds`);
    a list of numbers (``optim.betas``) counts, its items checked one by one."""
    from training.config import TrainConfig

    cls = cls or TrainConfig
    hints = typing.get_type_hints(cls)
    keys = []
    for field in dataclasses.fields(cls):
        hint, key = hints[field.name], prefix + field.name
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(hint):
            keys += _numeric_keys(hint, key + ".")
        elif hint in (int, float):
            keys.append((key, field, hint))
        elif isinstance(default, list) and default and all(type(v) in (int, float) for v in default):
            keys.append((key, field, list))
    return keys


NUMERIC_KEYS = _numeric_keys()


def _out_of_bounds(bounds, kind: type) -> list:
    """Values just outside ``bounds`` (each end that has one; NaN for a float), as a key of ``kind`` takes
    them: the table of the test below."""
    values = []
    if bounds.low is not None:
        values.append(bounds.low if bounds.low_open else bounds.low - 1)
    if bounds.high is not None:
        values.append(bounds.high if bounds.high_open else bounds.high + 1)
    if kind is int:
        values = [int(v) if float(v).is_integer() else v for v in values]
    if kind is float:
        values.append(float("nan"))
    return values


def test_every_numeric_key_has_bounds_and_its_default_is_within_them():
    assert len(NUMERIC_KEYS) > 40 and "optim.lr" in dict((k, f) for k, f, _ in NUMERIC_KEYS)
    unbounded = [key for key, field, _ in NUMERIC_KEYS if field.metadata.get("bounds") is None]
    assert not unbounded, f"numeric config keys without bounds (add bounds=... to their field): {unbounded}"
    for key, field, kind in NUMERIC_KEYS:
        default = field.default_factory() if kind is list else field.default
        items = default if kind is list else [default]
        assert all(field.metadata["bounds"].holds(v) for v in items), (key, default)


BAD_VALUES = [
    (key, value)
    for key, field, kind in NUMERIC_KEYS
    for value in _out_of_bounds(field.metadata["bounds"], kind)
]


@pytest.mark.parametrize("key, value", BAD_VALUES, ids=[f"{k}={v}" for k, v in BAD_VALUES])
def test_an_out_of_bounds_value_of_every_numeric_key_exits_2_naming_the_key(tmp_path, capsys, key, value):
    from training.cli import main

    bounds = dict((k, f) for k, f, _ in NUMERIC_KEYS)[key].metadata["bounds"]
    shown = value if value == value else ".nan"  # NaN, as YAML spells it
    override = f"{key}=[0.9, {shown}]" if key == "optim.betas" else f"{key}={shown}"
    run_dir = tmp_path / "run"
    assert main([override, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("progpo train: error: "), err
    assert key in err and str(bounds) in err, err
    assert not run_dir.exists()


def test_a_negative_learning_rate_is_refused_by_the_real_command_before_anything_is_built(tmp_path):
    """Issue 39, item 5: before, ``optim.lr=-1`` passed the config check and failed in torch with a traceback
    after the model was built, leaving a run folder; ``rollout.group_size=-4`` got a line that did not name
    the key."""
    for override, line in (
        ("optim.lr=-1", "progpo train: error: optim.lr must be > 0, got -1.0"),
        ("rollout.group_size=-4", "progpo train: error: rollout.group_size must be >= 1, got -4"),
    ):
        run_dir = tmp_path / "run"
        started = time.monotonic()
        done = subprocess.run(
            [*_progpo(), "train", override, "--run-dir", str(run_dir)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.monotonic() - started
        assert done.returncode == 2 and done.stderr == line + "\n", done.stderr
        assert seconds < 15, seconds  # the bound: nothing is imported or built past the config
        assert not run_dir.exists()
