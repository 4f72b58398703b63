"""Hand-computed GiGPO / G2PO / GraphGPO cases: loops, self-loops, unreachable goal, truncation, invalid
actions, singleton step groups, no repeated state (algorithms.md §3-§5, §7)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.advantages.advantages_batches import build_batch
from training.advantages import compute_advantages

G = 0.95
# loop_batch: a = s0 s1 s1 s2 (success, T=4), b = s0 s1 s3 (failure, T=3); cross-steps A^E in mean mode:
AE_A, AE_B = 10 - 40 / 7, -40 / 7


def test_gigpo_loop_case(loop_batch):
    adv = compute_advantages("gigpo", loop_batch, norm="mean")
    ra = [10 * G**3, 10 * G**2, 10 * G, 10.0]  # discounted step returns of a; b's are 0
    s0_mean = ra[0] / 2
    s1_mean = (ra[1] + ra[2]) / 3  # the loop's two visits of s1 are separate members
    expected = [
        AE_A + ra[0] - s0_mean,
        AE_A + ra[1] - s1_mean,
        AE_A + ra[2] - s1_mean,
        AE_A,  # s2: singleton -> 0
        AE_B - s0_mean,
        AE_B - s1_mean,
        AE_B,  # s3: singleton -> 0
    ]
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_gigpo_penalty_enters_step_return():
    b = build_batch([{"group": 0, "obs": ["x", "y"], "invalid": {0}}, {"group": 0, "obs": ["x", "y"]}])
    adv = compute_advantages("gigpo", b, norm="mean", step_weight=1.0)
    ae = compute_advantages("grpo", b, norm="mean")
    np.testing.assert_allclose(adv - ae, [-0.05, 0.0, 0.05, 0.0], atol=1e-12)


def test_gigpo_equals_grpo_when_no_state_repeats():
    b = build_batch(
        [
            {"group": 0, "obs": ["a", "b", "c"], "success": True, "invalid": {1}},
            {"group": 0, "obs": ["d", "e"]},
            {"group": 1, "obs": ["f"], "success": True},
            {"group": 1, "obs": ["g", "h"]},
        ]
    )
    for norm in ("mean_std", "mean"):
        for scope in ("cross_steps", "trajectory"):
            np.testing.assert_array_equal(
                compute_advantages("gigpo", b, norm=norm, stats_scope=scope),
                compute_advantages("grpo", b, norm=norm, stats_scope=scope),
            )


def test_gigpo_groups_never_span_task_groups():
    b = build_batch([{"group": 0, "obs": ["x"], "success": True}, {"group": 1, "obs": ["x"]}])
    # same obs key in two task groups: both anchor groups are singletons -> GiGPO = GRPO (singletons)
    np.testing.assert_array_equal(compute_advantages("gigpo", b), compute_advantages("grpo", b))


def test_g2po_node_values_use_T_minus_k_exponent(loop_batch):
    adv = compute_advantages("g2po", loop_batch, norm="mean")
    # V(v) = mean over visits of 0.95^(T_j - k) * R_j: a (T=4, R=10), b (R=0)
    v_s0 = (G**4 * 10 + 0) / 2
    v_s1 = (G**3 * 10 + G**2 * 10 + 0) / 3
    v_s2 = G * 10  # the last step of a success contributes 9.5, not 10
    v_s3 = 0.0
    # edges (rows): a0 s0->s1, a1 s1->s1 (self-loop), a2 s1->s2, a3 s2->SUCCESS,
    #               b0 s0->s1, b1 s1->s3, b2 s3->FAIL
    v_dst = np.array([v_s1, v_s1, v_s2, 10.0, v_s1, v_s3, 0.0])
    v_src = np.array([v_s0, v_s1, v_s1, v_s2, v_s0, v_s1, v_s3])
    c1 = np.zeros(7)
    s1_out = [1, 2, 5]
    c1[s1_out] = v_dst[s1_out] - v_dst[s1_out].mean()  # s0's out-edges are equal -> 0; s2, s3 singletons
    td = v_dst - v_src
    c2 = td - td.mean()
    assert td[1] == 0.0  # self-loop: zero TD error
    ae = np.array([AE_A] * 4 + [AE_B] * 3)
    np.testing.assert_allclose(adv, ae + c1 + c2, atol=1e-12)


def test_g2po_all_failed_group_only_penalty_contrast():
    b = build_batch([{"group": 0, "obs": ["x", "y"], "invalid": {0}}, {"group": 0, "obs": ["x", "y"]}])
    adv = compute_advantages("g2po", b, norm="mean")
    ae = compute_advantages("grpo", b, norm="mean")
    # V = 0 everywhere -> c2 = 0; c1 on node x compares -0.1 with 0; node y's edges both go to FAIL (0)
    np.testing.assert_allclose(adv - ae, [-0.05, 0.0, 0.05, 0.0], atol=1e-12)


def test_graphgpo_distances_loops_and_unreachable(loop_batch):
    adv = compute_advantages("graphgpo", loop_batch, norm="mean")
    # reverse BFS from the sink: d(s2)=1, d(s1)=2, d(s0)=3;
    # s3 and b's final observation are unreachable: d_max + 1 = 4
    rg = 10 * 0.1 ** np.array([2, 2, 1, 0, 2, 4, 4], dtype=float)
    ag = np.zeros(7)
    s1_out = [1, 2, 5]  # s1 -> s1 (self-loop), s1 -> s2 (progress), s1 -> s3 (dead end)
    ag[s1_out] = rg[s1_out] - rg[s1_out].mean()
    ae = np.array([AE_A] * 4 + [AE_B] * 3)
    np.testing.assert_allclose(adv, ae + ag, atol=1e-12)
    assert ag[2] > ag[1] > ag[5]  # progress > self-loop (no progress) > dead end


def test_graphgpo_truncated_and_unreachable_goal_group_has_no_graph_term():
    b = build_batch(
        [
            {"group": 0, "obs": ["x", "y", "x", "y"], "invalid": {2}},  # loops, truncated
            {"group": 0, "obs": ["x", "z"]},
        ]
    )
    np.testing.assert_array_equal(compute_advantages("graphgpo", b), compute_advantages("grpo", b))


@pytest.mark.parametrize("discount", [0.1, 0.5, 0.9])
def test_graphgpo_paper_and_reference_conventions_agree(loop_batch, discount):
    ref = compute_advantages(
        "graphgpo", loop_batch, distance_discount=discount, reward_convention="reference", beta_e=0.0
    )
    paper = compute_advantages(
        "graphgpo", loop_batch, distance_discount=discount, reward_convention="paper", beta_e=0.0
    )
    assert np.abs(ref).max() > 0.5
    np.testing.assert_allclose(
        paper, ref, atol=1e-4
    )  # equal up to eps: the factor distance_discount cancels in the z-score
    scaled = compute_advantages(
        "graphgpo", loop_batch, distance_discount=discount, success_reward=1000.0, beta_e=0.0
    )
    np.testing.assert_allclose(scaled, ref, atol=1e-4)  # and so does r_succ


@pytest.mark.parametrize("name", ["gigpo", "g2po", "graphgpo"])
def test_singleton_and_all_equal_groups_never_nan(name):
    b = build_batch(
        [
            {"group": 0, "obs": ["only"]},
            {"group": 1, "obs": ["x", "x"]},
            {"group": 1, "obs": ["x", "x"]},
            {"group": 2, "obs": ["w"], "success": True},
        ]
    )
    for norm in ("mean_std", "mean"):
        adv = compute_advantages(name, b, norm=norm)
        assert np.isfinite(adv).all()
        assert adv[1:5].tolist() == [0.0] * 4  # identical failed trajectories: every term is 0
