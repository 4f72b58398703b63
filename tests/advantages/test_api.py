"""Public API, registry and input validation of ``training.advantages``."""

from __future__ import annotations

import numpy as np
import pytest
from advantages_batches import build_batch, random_walk_batch
from advantages_reference import REFERENCES

from training.advantages import ESTIMATORS, compute_advantages, progpo_report, register_estimator
from training.advantages.registry import ESTIMATORS as REGISTRY
from training.advantages.registry import RENAMED_PARAMETERS

NAMES = ["grpo", "rloo", "dapo", "gigpo", "g2po", "graphgpo", "progpo", "progpo_coverage"]
#: Estimators whose advantage is A^E + step_weight * A^step.
STEP_WEIGHTED = ["gigpo", "g2po", "progpo", "progpo_coverage"]
#: (estimator, old keyword, new keyword): one name per concept (issue 19).
RENAMED = [
    ("gigpo", "omega", "step_weight"),
    ("g2po", "step_advantage_w", "step_weight"),
    ("progpo", "omega", "step_weight"),
    ("progpo_coverage", "omega", "step_weight"),
    ("graphgpo", "omega", "distance_discount"),
]


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


@pytest.mark.parametrize("name", STEP_WEIGHTED)
def test_step_weight_weighs_the_step_advantage(name):
    batch = random_walk_batch(6, seed=2, max_steps=20)
    episode = compute_advantages(name, batch, norm="mean", step_weight=0.0)
    if name != "progpo_coverage":  # whose all-failed groups score coverage instead of the episode reward
        assert np.array_equal(episode, compute_advantages("grpo", batch, norm="mean"))
    full = compute_advantages(name, batch, norm="mean", step_weight=1.0)
    assert np.abs(full - episode).max() > 0.1  # this batch has a step signal to weigh
    half = compute_advantages(name, batch, norm="mean", step_weight=0.5)
    np.testing.assert_allclose(half, episode + 0.5 * (full - episode), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        half, REFERENCES[name](batch, norm="mean", step_weight=0.5), rtol=1e-9, atol=1e-9
    )


def test_graphgpo_distance_discount_sets_the_graph_reward(loop_batch):
    low = compute_advantages("graphgpo", loop_batch, distance_discount=0.2, beta_e=0.0, norm="mean")
    high = compute_advantages("graphgpo", loop_batch, distance_discount=0.9, beta_e=0.0, norm="mean")
    assert not np.allclose(low, high)  # under mean-centring the discount's scale is not normalised away
    np.testing.assert_allclose(
        low, REFERENCES["graphgpo"](loop_batch, distance_discount=0.2, beta_e=0.0, norm="mean"), atol=1e-12
    )
    with pytest.raises(ValueError, match=r"parameter 'distance_discount'=0.0 must lie in \(0.0, 1.0\]"):
        compute_advantages("graphgpo", loop_batch, distance_discount=0.0)


def test_renamed_parameters_are_exactly_the_listed_ones():
    assert {(n, old, new) for n, table in RENAMED_PARAMETERS.items() for old, new in table.items()} == set(
        RENAMED
    )


@pytest.mark.parametrize(("name", "old", "new"), RENAMED)
def test_old_parameter_name_answers_with_the_new_one(name, old, new, batch):
    message = f"estimator '{name}': parameter '{old}' was renamed; use '{new}'"
    with pytest.raises(ValueError, match=message):
        compute_advantages(name, batch, **{old: 0.5})
    with pytest.raises(ValueError, match=message):  # also beside a valid parameter, and on an empty batch
        compute_advantages(name, {k: v[:0] for k, v in batch.items()}, norm="mean", **{old: 0.5})
    assert new in ESTIMATORS[name].parameters and old not in ESTIMATORS[name].parameters
    compute_advantages(name, batch, **{new: 0.5})


def test_progpo_report_answers_the_old_name_too(batch):
    with pytest.raises(ValueError, match="parameter 'omega' was renamed; use 'step_weight'"):
        progpo_report(batch, omega=0.5)
    assert progpo_report(batch, step_weight=0.5)["config"]["step_weight"] == 0.5


def test_a_rename_that_does_not_match_the_signature_fails_at_registration(monkeypatch):
    monkeypatch.setitem(RENAMED_PARAMETERS, "test_renamed", {"old_weight": "new_weight"})

    def still_old(steps, *, old_weight: float = 1.0):
        return np.full(steps.n_rows, old_weight)

    with pytest.raises(ValueError, match="RENAMED_PARAMETERS"):
        register_estimator("test_renamed")(still_old)
    assert "test_renamed" not in ESTIMATORS


@pytest.mark.parametrize("name", NAMES)
def test_shared_parameters_are_checked_alike_by_every_estimator(name, batch):
    bad = {
        "norm": ("std", r"parameter 'norm': unknown value 'std'; choose one of \['mean_std', 'mean'\]"),
        "stats_scope": ("batch", r"parameter 'stats_scope': unknown value 'batch'"),
        "eps": (0.0, r"parameter 'eps'=0.0 must lie in \(0.0, 1.0\]"),
        "invalid_penalty": (-1.0, r"parameter 'invalid_penalty'=-1.0 must lie in \[0.0, inf\]"),
        "gamma": (1.5, r"parameter 'gamma'=1.5 must lie in \[0.0, 1.0\]"),
    }
    shared = [p for p in bad if p in ESTIMATORS[name].parameters]
    assert {"stats_scope", "invalid_penalty"} <= set(shared)
    for param in shared:
        value, message = bad[param]
        with pytest.raises(ValueError, match=message):
            compute_advantages(name, batch, **{param: value})
