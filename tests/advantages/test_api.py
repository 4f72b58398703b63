"""Public API, registry and input validation of ``training.advantages``."""

from __future__ import annotations

import numpy as np
import pytest
from advantages_batches import build_batch

from training.advantages import ESTIMATORS, compute_advantages, register_estimator
from training.advantages.registry import ESTIMATORS as REGISTRY

NAMES = ["grpo", "rloo", "dapo", "gigpo", "g2po", "graphgpo", "progpo", "progpo_coverage"]


@pytest.fixture
def batch():
    return build_batch(
        [
            {"group": 3, "obs": ["x", "y"], "success": True},
            {"group": 3, "obs": ["x", "z", "z"], "invalid": {1}},
            {"group": 5, "obs": ["p"]},
        ]
    )


def test_registry_holds_exactly_the_named_estimators():
    assert sorted(ESTIMATORS) == sorted(NAMES)
    assert ESTIMATORS is REGISTRY


@pytest.mark.parametrize("name", NAMES)
def test_output_is_float64_vector_in_row_order(name, batch):
    adv = compute_advantages(name, batch)
    assert adv.dtype == np.float64 and adv.shape == (6,)
    assert np.isfinite(adv).all()
    assert np.array_equal(ESTIMATORS[name](batch), adv)  # the registry entry is the same function


def test_unknown_estimator_is_named(batch):
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", batch)


def test_unknown_parameter_is_named(batch):
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['gama'\]"):
        compute_advantages("gigpo", batch, gama=0.9)


def test_bad_parameter_value_is_named(batch):
    with pytest.raises(ValueError, match="'norm'"):
        compute_advantages("grpo", batch, norm="std")
    with pytest.raises(ValueError, match="'stats_scope'"):
        compute_advantages("rloo", batch, stats_scope="batch")
    with pytest.raises(ValueError, match="'gamma'"):
        compute_advantages("gigpo", batch, gamma=1.5)
    with pytest.raises(ValueError, match="'depths'"):
        compute_advantages("progpo", batch, depths=(0, -1))


def test_missing_column_is_named(batch):
    del batch["valid"]
    with pytest.raises(ValueError, match="missing required column.*'valid'"):
        compute_advantages("grpo", batch)


def test_length_mismatch(batch):
    batch["reward"] = batch["reward"][:-1]
    with pytest.raises(ValueError, match="mismatched lengths"):
        compute_advantages("grpo", batch)


def test_nan_reward(batch):
    batch["reward"][2] = np.nan
    with pytest.raises(ValueError, match="'reward' contains NaN"):
        compute_advantages("gigpo", batch)


@pytest.mark.parametrize("steps", [[0, 1, 0, 2, 3, 0], [0, 1, 0, 1, 1, 0], [1, 2, 0, 1, 2, 0]])
def test_non_contiguous_or_duplicate_steps(batch, steps):
    batch["step"] = np.array(steps)
    with pytest.raises(ValueError, match="contiguous steps"):
        compute_advantages("grpo", batch)


def test_trajectory_spanning_groups(batch):
    batch["group_id"][1] = 9
    with pytest.raises(ValueError, match="spans several group_id"):
        compute_advantages("grpo", batch)


def test_bad_dtypes(batch):
    with pytest.raises(ValueError, match="'step' must hold integers"):
        compute_advantages("grpo", {**batch, "step": batch["step"].astype(float)})
    with pytest.raises(ValueError, match="'obs_key'"):
        compute_advantages("grpo", {**batch, "obs_key": np.linspace(0, 1, 6)})
    with pytest.raises(ValueError, match="mapping"):
        compute_advantages("grpo", [1, 2, 3])


def test_uint64_str_and_bytes_keys_agree(batch):
    from training.advantages.batch import keys_to_uint64

    as_u64 = {
        **batch,
        "obs_key": keys_to_uint64(batch["obs_key"], "obs_key"),
        "action_key": keys_to_uint64(batch["action_key"], "action_key"),
    }
    as_bytes = {**batch, "obs_key": np.array([k.encode() for k in batch["obs_key"]], dtype=object)}
    for name in NAMES:
        ref = compute_advantages(name, batch)
        assert np.array_equal(compute_advantages(name, as_u64), ref)
        assert np.array_equal(compute_advantages(name, as_bytes), ref)


def test_empty_batch():
    empty = build_batch([{"group": 0, "obs": ["x"]}])
    empty = {k: v[:0] for k, v in empty.items()}
    for name in NAMES:
        assert compute_advantages(name, empty).shape == (0,)


def test_adding_an_estimator_is_one_registered_function(batch):
    @register_estimator("test_constant")
    def constant(steps, *, value: float = 1.0):
        return np.full(steps.n_rows, value)

    try:
        assert compute_advantages("test_constant", batch, value=2.5).tolist() == [2.5] * 6
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_constant")(constant)
    finally:
        del ESTIMATORS["test_constant"]
