"""Hand-computed GRPO / RLOO / DAPO cases (algorithms.md §2, §1.3, §7)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from tests.training.advantages.advantages_batches import build_batch
from training.advantages import compute_advantages

EPS = 1e-6


@pytest.fixture
def batch():
    # group 0: a succeeds in 2 steps; b fails in 3 steps with an invalid action at step 1
    # group 1: singleton (one trajectory, one step, success)
    # group 2: all-equal (two failed trajectories, all valid)
    # group 3: all-failed with one invalid row
    return build_batch(
        [
            {"group": 0, "obs": ["s0", "s1"], "success": True},
            {"group": 0, "obs": ["s0", "s2", "s3"], "invalid": {1}},
            {"group": 1, "obs": ["t0"], "success": True},
            {"group": 2, "obs": ["u0", "u1"]},
            {"group": 2, "obs": ["u0"]},
            {"group": 3, "obs": ["v0", "v1"], "invalid": {1}},
            {"group": 3, "obs": ["v0"]},
        ]
    )


def test_grpo_mean_norm_cross_steps(batch):
    adv = compute_advantages("grpo", batch, norm="mean")
    m0 = (10 + 10 + 0 - 0.1 + 0) / 5
    m3 = -0.1 / 3
    expected = [10 - m0, 10 - m0, -m0, -0.1 - m0, -m0, 10.0, 0.0, 0.0, 0.0, -m3, -0.1 - m3, -m3]
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_grpo_mean_std_cross_steps(batch):
    adv = compute_advantages("grpo", batch)
    s0 = [10, 10, 0, -0.1, 0]
    m0, sd0 = statistics.mean(s0), statistics.stdev(s0)
    np.testing.assert_allclose(adv[:5], [(x - m0) / (sd0 + EPS) for x in s0], rtol=1e-12)
    assert adv[5] == 10 / (1 + EPS)  # singleton: mean 0, std 1 (verl-agent)
    assert adv[6:9].tolist() == [0.0, 0.0, 0.0]  # all-equal group: exactly 0, no NaN
    # all-failed group: the -0.1 penalty is the only variation and z-scoring blows it up to O(1) (§1.3)
    s3 = [0, -0.1, 0]
    np.testing.assert_allclose(
        adv[9:], [(x - statistics.mean(s3)) / (statistics.stdev(s3) + EPS) for x in s3]
    )
    assert adv[10] < -1.1 and adv[9] > 0.5


def test_grpo_sums_to_zero_per_group_under_cross_steps(batch):
    adv = compute_advantages("grpo", batch)
    for g in (0, 2, 3):
        assert abs(adv[batch["group_id"] == g].sum()) < 1e-9


def test_grpo_trajectory_scope(batch):
    adv = compute_advantages("grpo", batch, stats_scope="trajectory")
    sd = statistics.stdev([10, 0])
    np.testing.assert_allclose(
        adv[:5], [5 / (sd + EPS)] * 2 + [-5 / (sd + EPS), -5.1 / (sd + EPS), -5 / (sd + EPS)]
    )
    assert adv[5] == 10 / (1 + EPS)
    # group 3: both episode rewards are 0 -> zero spread -> 0 even for the invalid row
    assert adv[9:].tolist() == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out(batch):
    adv = compute_advantages("rloo", batch)
    total = 19.9
    np.testing.assert_allclose(adv[:5], [10 - (total - 10) / 4] * 2 + [-total / 4, -0.1 - 20 / 4, -total / 4])
    assert adv[5] == 10.0  # singleton: A = S
    assert adv[6:9].tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(adv[9:], [0 + 0.1 / 2, -0.1 - 0, 0 + 0.1 / 2])
    traj = compute_advantages("rloo", batch, stats_scope="trajectory")
    np.testing.assert_allclose(traj[:5], [10, 10, -10, -10.1, -10])
    np.testing.assert_allclose(traj[9:], [0, -0.1, 0])


def test_dapo_zeroes_groups_dynamic_sampling_drops(batch):
    adv = compute_advantages("dapo", batch)
    grpo = compute_advantages("grpo", batch)
    np.testing.assert_array_equal(adv[:5], grpo[:5])  # group 0 has distinct rewards: kept
    assert adv[5:].tolist() == [0.0] * 7  # singleton / all-equal / all-failed groups are dropped
    np.testing.assert_array_equal(compute_advantages("dapo", batch, drop_uniform_groups=False), grpo)
