"""Public API, registry and input validation of ``training.advantages``.

Tests that concern every estimator iterate the registry (``ESTIMATORS``), so an estimator registered later,
like the toy of ``advantages_toy``, is covered without editing them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from tests.paths import REPO_ROOT
from tests.training.advantages.advantages_batches import build_batch, random_walk_batch
from tests.training.advantages.advantages_reference import reference
from training.advantages import (
    ESTIMATORS,
    SharedParams,
    compute_advantages,
    progpo_report,
    register_estimator,
)
from training.advantages.registry import ESTIMATORS as REGISTRY

NAMES = sorted(ESTIMATORS)
#: Estimators whose step term is switched off by one weight set to 0 (``step_weight``, GraphGPO's ``beta_g``).
WEIGHTED = [n for n in NAMES if list(ESTIMATORS[n].episode_only.values()) == [0.0]]
#: The estimators whose episode term A^E is GRPO's advantage (algorithms.md §3-6; not progpo_coverage,
#: whose all-failed groups score coverage).
EPISODE_TERM_IS_GRPO = ["gigpo", "g2po", "graphgpo", "progpo"]
#: (estimator, old keyword, new keyword) of the package's estimators: one name per concept (issue 19).
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


def test_the_package_imports_every_module_that_registers_an_estimator():
    """A module of ``training/advantages`` missing from ``__init__.py``'s import list registers nothing."""
    code = (
        "import importlib, pkgutil, training.advantages as a; before = set(a.ESTIMATORS);"
        "[importlib.import_module(m.name) for m in pkgutil.iter_modules(a.__path__, 'training.advantages.')];"
        "print(sorted(set(a.ESTIMATORS) - before))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "[]", f"import these in training/advantages/__init__.py: {done.stdout}"
    assert ESTIMATORS is REGISTRY
    assert {"grpo", "rloo", "dapo", "gigpo", "g2po", "graphgpo", "progpo", "progpo_coverage"} <= set(NAMES)


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


@dataclass(frozen=True)
class ConstantParams(SharedParams):
    value: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.value < 0:
            raise ValueError(f"parameter 'value' must be >= 0, got {self.value}")


def test_adding_an_estimator_is_one_registration(batch):
    def constant(steps, params: ConstantParams):
        return np.full(steps.n_rows, params.value - params.invalid_penalty)

    assert register_estimator("test_constant", params=ConstantParams)(constant) is constant
    try:
        estimator = ESTIMATORS["test_constant"]
        assert estimator.parameters == ("stats_scope", "invalid_penalty", "value")
        assert dict(estimator.episode_only) == {} and dict(estimator.renamed) == {}
        assert (
            compute_advantages("test_constant", batch, value=2.5, invalid_penalty=0.5).tolist() == [2.0] * 6
        )
        with pytest.raises(ValueError, match="parameter 'value' must be >= 0"):  # __post_init__ validates
            compute_advantages("test_constant", batch, value=-1.0)
        with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['norm'\]"):
            compute_advantages("test_constant", batch, norm="mean")
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_constant", params=ConstantParams)(constant)
    finally:
        del ESTIMATORS["test_constant"]


@pytest.mark.parametrize(
    ("registration", "error", "message"),
    [
        ({"params": dict}, TypeError, "params must be a dataclass extending SharedParams"),
        (
            {"params": ConstantParams, "episode_only": {"weight": 0.0}},
            ValueError,
            r"episode_only names \['weight'\]",
        ),
        (
            {"params": ConstantParams, "episode_only": {"invalid_penalty": -1.0}},
            ValueError,
            "'invalid_penalty'=-1.0",
        ),
        ({"params": ConstantParams, "renamed": {"value": "level"}}, ValueError, "renamed .* does not match"),
        (
            {"params": ConstantParams, "renamed": {"old_value": "level"}},
            ValueError,
            "renamed .* does not match",
        ),
    ],
)
def test_a_registration_whose_facts_do_not_match_its_params_fails_at_once(registration, error, message):
    with pytest.raises(error, match=message):
        register_estimator("test_mismatch", **registration)(lambda steps, params: np.zeros(steps.n_rows))
    assert "test_mismatch" not in ESTIMATORS


@pytest.mark.parametrize("name", WEIGHTED)
def test_the_episode_only_weight_weighs_the_step_term(name):
    """A = A^E + w * A^step: linear in the weight the registration's ``episode_only`` sets to 0."""
    (weight,) = ESTIMATORS[name].episode_only
    batch = random_walk_batch(6, seed=2, max_steps=20)
    mean = {"norm": "mean"} if "norm" in ESTIMATORS[name].parameters else {}
    episode = compute_advantages(name, batch, **mean, **{weight: 0.0})
    full = compute_advantages(name, batch, **mean, **{weight: 1.0})
    assert np.abs(full - episode).max() > 0.1  # this batch has a step signal to weigh
    half = compute_advantages(name, batch, **mean, **{weight: 0.5})
    np.testing.assert_allclose(half, episode + 0.5 * (full - episode), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(half, reference(name)(batch, **mean, **{weight: 0.5}), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", EPISODE_TERM_IS_GRPO)
def test_the_episode_term_is_grpo(name):
    batch = random_walk_batch(6, seed=2, max_steps=20)
    episode = compute_advantages(name, batch, norm="mean", **ESTIMATORS[name].episode_only)
    assert np.array_equal(episode, compute_advantages("grpo", batch, norm="mean"))


def test_graphgpo_distance_discount_sets_the_graph_reward(loop_batch):
    low = compute_advantages("graphgpo", loop_batch, distance_discount=0.2, beta_e=0.0, norm="mean")
    high = compute_advantages("graphgpo", loop_batch, distance_discount=0.9, beta_e=0.0, norm="mean")
    assert not np.allclose(low, high)  # under mean-centring the discount's scale is not normalised away
    np.testing.assert_allclose(
        low, reference("graphgpo")(loop_batch, distance_discount=0.2, beta_e=0.0, norm="mean"), atol=1e-12
    )
    with pytest.raises(ValueError, match=r"parameter 'distance_discount'=0.0 must lie in \(0.0, 1.0\]"):
        compute_advantages("graphgpo", loop_batch, distance_discount=0.0)


def test_the_package_renames_exactly_the_listed_parameters():
    package = [n for n in NAMES if ESTIMATORS[n].fn.__module__.startswith("training.advantages.")]
    assert {(n, old, new) for n in package for old, new in ESTIMATORS[n].renamed.items()} == set(RENAMED)


@pytest.mark.parametrize(
    ("name", "old", "new"), [(n, old, new) for n in NAMES for old, new in ESTIMATORS[n].renamed.items()]
)
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


def test_check_parameter_names_reads_the_renames_from_the_registration():
    from training.advantages import check_parameter_names

    with pytest.raises(ValueError, match="'omega' was renamed; use 'distance_discount'"):
        check_parameter_names("graphgpo", ["omega"], ESTIMATORS["graphgpo"].parameters)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['omega'\]"):  # rloo renamed nothing
        check_parameter_names("rloo", ["omega"], ESTIMATORS["rloo"].parameters)
    check_parameter_names("progpo", ["step_weight", "depths"], ESTIMATORS["progpo"].parameters)


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
