"""Property tests (hypothesis) and cross-checks against the per-row Python reference implementations.

The generic tests iterate the registry: an estimator registered later is covered, and one without a reference
oracle fails naming the function to add (``advantages_reference.reference``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import REPO_ROOT
from tests.training.advantages.advantages_batches import random_walk_batch
from tests.training.advantages.advantages_reference import reference
from training.advantages import ESTIMATORS, compute_advantages

NAMES = sorted(ESTIMATORS)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw, unique_obs: bool = False):
    """Small batches with heavy state repeats, loops, invalid actions, successes and truncations."""
    n_groups = draw(st.integers(1, 3))
    cols = {k: [] for k in ("group_id", "traj_id", "step", "reward", "won", "valid", "obs_key", "action_key")}
    traj = 0
    fresh = iter(range(10**6))
    for g in range(n_groups):
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 6))
            success = draw(st.booleans())
            for s in range(length):
                won = success and s == length - 1
                cols["group_id"].append(g * 10)
                cols["traj_id"].append(traj)
                cols["step"].append(s)
                cols["reward"].append(10.0 if won else 0.0)
                cols["won"].append(won)
                cols["valid"].append(draw(st.booleans()) or draw(st.booleans()))
                cols["obs_key"].append(next(fresh) if unique_obs else draw(st.integers(0, 3)))
                cols["action_key"].append(draw(st.integers(0, 2)))
            traj += 1
    out = {k: np.array(v) for k, v in cols.items()}
    out["obs_key"] = out["obs_key"].astype(np.uint64)
    out["action_key"] = out["action_key"].astype(np.uint64)
    return out


def _permute(batch, perm):
    return {k: v[perm] for k, v in batch.items()}


@SETTINGS
@given(batch=batches(), seed=st.integers(0, 2**31 - 1))
def test_permuting_rows_permutes_output(batch, seed):
    perm = np.random.default_rng(seed).permutation(batch["step"].size)
    for name in NAMES:
        np.testing.assert_allclose(
            compute_advantages(name, _permute(batch, perm)),
            compute_advantages(name, batch)[perm],
            rtol=1e-9,
            atol=1e-9,
        )


@SETTINGS
@given(batch=batches(), seed=st.integers(0, 2**31 - 1))
def test_relabelling_ids_and_keys_changes_nothing(batch, seed):
    rng = np.random.default_rng(seed)
    relabelled = dict(batch)
    relabelled["group_id"] = batch["group_id"] * 7 - 1000
    traj_map = rng.permutation(batch["traj_id"].max() + 1) * 3 + 5
    relabelled["traj_id"] = traj_map[batch["traj_id"]]
    relabelled["obs_key"] = np.array([f"state-{k}" for k in batch["obs_key"]], dtype=object)
    relabelled["action_key"] = batch["action_key"] ^ np.uint64(0xDEADBEEFCAFE)
    for name in NAMES:
        np.testing.assert_allclose(
            compute_advantages(name, relabelled), compute_advantages(name, batch), rtol=1e-9, atol=1e-9
        )


@SETTINGS
@given(
    batch=batches(),
    norm=st.sampled_from(["mean_std", "mean"]),
    scope=st.sampled_from(["cross_steps", "trajectory"]),
)
def test_output_finite_and_matches_reference(batch, norm, scope):
    for name in NAMES:
        shared = {"norm": norm, "stats_scope": scope}
        kwargs = {k: v for k, v in shared.items() if k in ESTIMATORS[name].parameters}  # rloo has no norm
        adv = compute_advantages(name, batch, **kwargs)
        assert np.isfinite(adv).all()
        np.testing.assert_allclose(adv, reference(name)(batch, **kwargs), rtol=1e-9, atol=1e-9, err_msg=name)


@SETTINGS
@given(batch=batches())
def test_grpo_sums_to_zero_per_group_cross_steps(batch):
    adv = compute_advantages("grpo", batch)
    for g in np.unique(batch["group_id"]):
        rows = batch["group_id"] == g
        if rows.sum() > 1:
            assert abs(adv[rows].sum()) < 1e-6
    rloo = compute_advantages("rloo", batch)
    for g in np.unique(batch["group_id"]):
        rows = batch["group_id"] == g
        if rows.sum() > 1:
            assert abs(rloo[rows].sum()) < 1e-9


@SETTINGS
@given(batch=batches(unique_obs=True))
def test_gigpo_is_grpo_without_repeated_states(batch):
    np.testing.assert_array_equal(compute_advantages("gigpo", batch), compute_advantages("grpo", batch))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_matches_reference_on_random_walk_batches(name, seed):
    batch = random_walk_batch(12, seed=seed, max_steps=30)
    perm = np.random.default_rng(seed).permutation(batch["step"].size)
    batch = _permute(batch, perm)
    np.testing.assert_allclose(compute_advantages(name, batch), reference(name)(batch), rtol=1e-9, atol=1e-9)


def test_a_generic_test_of_an_estimator_without_an_oracle_fails_naming_it():
    from training.advantages import SharedParams, register_estimator

    register_estimator("test_no_oracle", params=SharedParams)(lambda steps, params: np.zeros(steps.n_rows))
    try:
        with pytest.raises(
            LookupError, match="add ref_test_no_oracle to tests/training/advantages/advantages_reference.py"
        ):
            test_matches_reference_on_random_walk_batches("test_no_oracle", 0)
    finally:
        del ESTIMATORS["test_no_oracle"]


def _spread_along_trajectories(batch, adv: np.ndarray) -> float:
    """Largest spread of ``adv`` over the rows of one trajectory that share their validity."""
    _, cell = np.unique(batch["traj_id"] * 2 + batch["valid"], return_inverse=True)
    high = np.full(cell.max() + 1, -np.inf)
    low = np.full(cell.max() + 1, np.inf)
    np.maximum.at(high, cell, adv)
    np.minimum.at(low, cell, adv)
    return float((high - low).max())


@pytest.mark.parametrize("name", NAMES)
def test_episode_only_parameters_leave_a_trajectory_level_advantage(name):
    """With its registration's ``episode_only`` parameters (none for GRPO, RLOO, DAPO) an estimator depends
    on a row only through its trajectory and validity (the penalty); with its defaults, one that has a step
    term tells the rows of a trajectory apart."""
    batch = random_walk_batch(6, seed=2, max_steps=20)
    off = dict(ESTIMATORS[name].episode_only)
    for scope in ("cross_steps", "trajectory"):
        episode = compute_advantages(name, batch, stats_scope=scope, **off)
        assert _spread_along_trajectories(batch, episode) < 1e-12, (
            f"{name} with episode_only={off} still varies along a trajectory: register the parameters that "
            "switch its step term off"
        )
    if off:
        assert _spread_along_trajectories(batch, compute_advantages(name, batch)) > 0.1


def test_matches_reference_with_text_and_switches():
    batch = random_walk_batch(6, seed=3, max_steps=25, with_text=True)
    for kwargs in (
        {},
        {"transition_mode": "additive"},
        {"reliability_gate": False},
        {"depths": (0, "inf")},
        {"min_samples": 3, "variance_floor": 0.5},
        {"success_potential": 10.0},
        {"dedup_depths": False},
        {"leave_one_out": True},
        {"semantic": "normalized_text"},
        {"leave_one_out": True, "dedup_depths": False, "min_samples": 1},
    ):
        np.testing.assert_allclose(
            compute_advantages("progpo", batch, **kwargs),
            reference("progpo")(batch, **kwargs),
            rtol=1e-9,
            atol=1e-9,
            err_msg=str(kwargs),
        )
    for kwargs in ({"reward_convention": "paper"}, {"distance_discount": 0.5, "beta_g": 2.0}):
        np.testing.assert_allclose(
            compute_advantages("graphgpo", batch, **kwargs),
            reference("graphgpo")(batch, **kwargs),
            rtol=1e-9,
            atol=1e-9,
        )
    np.testing.assert_allclose(
        compute_advantages("progpo_coverage", batch, coverage="group"),
        reference("progpo_coverage")(batch, coverage="group"),
        rtol=1e-9,
        atol=1e-9,
    )


def test_deterministic_across_calls():
    batch = random_walk_batch(8, seed=11)
    for name in NAMES:
        assert np.array_equal(compute_advantages(name, batch), compute_advantages(name, batch))


def test_same_output_in_a_fresh_process():
    """No process-dependent state (Python's salted hash(), dict order) leaks into the advantages."""
    import subprocess
    import sys

    code = (  # run in the repository root: `python -c` puts it on sys.path, so the tests package imports
        "import numpy as np; import tests.training.advantages.advantages_toy;"
        "from tests.training.advantages.advantages_batches import random_walk_batch;"
        "from training.advantages import compute_advantages, ESTIMATORS;"
        "b = random_walk_batch(8, seed=5, with_text=True);"
        "b['obs_key'] = np.array([f'o{k}' for k in b['obs_key']], dtype=object);"
        "print(repr([compute_advantages(n, b).tolist() for n in sorted(ESTIMATORS)]))"
    )
    env = {"PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env=env,
    )
    batch = random_walk_batch(8, seed=5, with_text=True)
    batch["obs_key"] = np.array([f"o{k}" for k in batch["obs_key"]], dtype=object)
    assert out.stdout.strip() == repr([compute_advantages(n, batch).tolist() for n in NAMES])


@pytest.mark.parametrize("name", NAMES)
def test_chunked_hashing_matches_reference(name, monkeypatch):
    """Tiny chunks force group-scoped hashing through many chunks (as at a million rows)."""
    import training.advantages.batch as batch_module

    monkeypatch.setattr(batch_module, "CHUNK_ROWS", 40)
    batch = random_walk_batch(10, seed=4, max_steps=20)
    batch = _permute(batch, np.random.default_rng(4).permutation(batch["step"].size))
    assert batch_module.StepBatch.from_columns(batch).chunk_bounds.size > 3
    np.testing.assert_allclose(compute_advantages(name, batch), reference(name)(batch), rtol=1e-9, atol=1e-9)
