"""The graph estimators' state key (``state_key``): observation, or observation + admissible-action set.

The hand-computed batch has one aliased observation: trajectory a sees "x" twice, before and after its
first action (a different admissible set each time, as ALFWorld's text can stay the same while the
agent's options change), then wins; trajectory b leaves "x" for a dead end "z" and fails.

    a: (x, {A}) -take-> (x, {B}) -finish-> success         R = 10
    b: (x, {A}) -go->   (z, {Z}) -wait->   (end, failed)   R = 0

Keyed by the observation, a's progress action is a self-loop x -> x; keyed by observation + actions it
leaves x|A for x|B, one step closer to the goal.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.advantages.advantages_batches import build_batch
from training.advantages import StepBatch, compute_advantages

G = 0.95


def _aliased_batch() -> dict[str, np.ndarray]:
    b = build_batch(
        [
            {"group": 0, "obs": ["x", "x"], "actions": ["take", "finish"], "success": True},
            {"group": 0, "obs": ["x", "z"], "actions": ["go", "wait"]},
        ]
    )
    b["admissible_key"] = np.array(["A", "B", "A", "Z"], dtype=object)  # rows a0 a1 b0 b1
    return b


# cross-steps episode advantage in mean mode: scores 10, 10, 0, 0 -> mean 5
AE = np.array([5.0, 5.0, -5.0, -5.0])


def test_graphgpo_observation_key_by_hand():
    adv = compute_advantages("graphgpo", _aliased_batch(), norm="mean")
    # nodes x, z; edges a0 x->x, a1 x->sink, b0 x->z, b1 z->unseen; d(x) = 1, z unreachable: d_max + 1 = 2
    rg = np.array([10 * 0.1**1, 10.0, 10 * 0.1**2, 10 * 0.1**2])
    x_out = rg[:3].mean()  # a0, a1, b0 leave x; b1 is z's only edge -> 0
    ag = np.array([rg[0] - x_out, rg[1] - x_out, rg[2] - x_out, 0.0])
    np.testing.assert_allclose(adv, AE + ag, atol=1e-12)
    assert ag[0] < 0  # aliasing: the progress action "take" looks like a self-loop and is blamed


def test_graphgpo_observation_actions_key_by_hand():
    b = _aliased_batch()
    adv = compute_advantages("graphgpo", b, norm="mean", state_key="observation_actions")
    # nodes x|A, x|B, z|Z; d(x|B) = 1, d(x|A) = 2, z unreachable: d_max + 1 = 3
    # x|A's edges: a0 -> x|B (R^G = 10 * 0.1) and b0 -> z (10 * 0.1^3); x|B and z|Z have one edge each
    r_a0, r_b0 = 10 * 0.1**1, 10 * 0.1**3
    mid = (r_a0 + r_b0) / 2
    np.testing.assert_allclose(adv, AE + [r_a0 - mid, 0.0, r_b0 - mid, 0.0], atol=1e-12)
    # z-score of two different values, ddof 1: +-(d / sqrt(2)) / (d / sqrt(2) + eps) with d = r_a0 - r_b0
    z = compute_advantages("graphgpo", b, state_key="observation_actions", beta_e=0.0)
    half = (r_a0 - r_b0) / 2
    std = (r_a0 - r_b0) / np.sqrt(2)
    np.testing.assert_allclose(z, [half / (std + 1e-6), 0.0, -half / (std + 1e-6), 0.0], atol=1e-12)


def test_g2po_observation_key_by_hand():
    adv = compute_advantages("g2po", _aliased_batch(), norm="mean")
    # V(v) = mean over visits of 0.95^(T - k) * R: x is visited by a0 (9.025), a1 (9.5), b0 (0); V(z) = 0
    v_x = (G**2 * 10 + G * 10 + 0.0) / 3
    v_src = np.array([v_x, v_x, v_x, 0.0])
    v_dst = np.array([v_x, 10.0, 0.0, 0.0])  # a0 -> x, a1 -> SUCCESS, b0 -> z, b1 -> FAIL
    c1 = np.array([*(v_dst[:3] - v_dst[:3].mean()), 0.0])  # x's out-edges a0, a1, b0; z: singleton
    td = v_dst - v_src
    np.testing.assert_allclose(adv, AE + c1 + (td - td.mean()), atol=1e-12)


def test_g2po_observation_actions_key_by_hand():
    adv = compute_advantages("g2po", _aliased_batch(), norm="mean", state_key="observation_actions")
    v_xa = (G**2 * 10 + 0.0) / 2  # x|A: visits a0, b0
    v_xb = G * 10  # x|B: visit a1
    v_src = np.array([v_xa, v_xb, v_xa, 0.0])
    v_dst = np.array([v_xb, 10.0, 0.0, 0.0])
    c1 = np.array([v_xb - v_xb / 2, 0.0, 0.0 - v_xb / 2, 0.0])  # x|A's edges a0, b0; the others singletons
    td = v_dst - v_src
    np.testing.assert_allclose(adv, AE + c1 + (td - td.mean()), atol=1e-12)
    assert adv[0] > compute_advantages("g2po", _aliased_batch(), norm="mean")[0]


@pytest.mark.parametrize("name", ["graphgpo", "g2po"])
def test_default_key_ignores_the_admissible_column(name):
    b = _aliased_batch()
    without = {k: v for k, v in b.items() if k != "admissible_key"}
    np.testing.assert_array_equal(compute_advantages(name, b), compute_advantages(name, without))
    np.testing.assert_array_equal(
        compute_advantages(name, b, state_key="observation"), compute_advantages(name, without)
    )


@pytest.mark.parametrize("name", ["graphgpo", "g2po"])
def test_one_action_set_per_observation_gives_the_observation_numbers(name):
    b = _aliased_batch()
    b["admissible_key"] = np.array(["X", "X", "X", "Z"], dtype=object)  # no observation is split
    np.testing.assert_array_equal(
        compute_advantages(name, b, state_key="observation_actions"), compute_advantages(name, b)
    )


@pytest.mark.parametrize("name", ["graphgpo", "g2po"])
def test_observation_actions_needs_the_column(name):
    b = {k: v for k, v in _aliased_batch().items() if k != "admissible_key"}
    with pytest.raises(ValueError, match="'admissible_key'"):
        compute_advantages(name, b, state_key="observation_actions")


@pytest.mark.parametrize("name", ["graphgpo", "g2po"])
def test_unknown_state_key_lists_the_choices(name):
    with pytest.raises(ValueError, match=r"'state_key'.*\['observation', 'observation_actions'\]"):
        compute_advantages(name, _aliased_batch(), state_key="obs+admissible")


def test_equal_action_sets_in_other_task_groups_never_merge():
    b = build_batch(
        [
            {"group": 0, "obs": ["x"], "success": True},
            {"group": 0, "obs": ["y"]},
            {"group": 1, "obs": ["x"], "success": True},
            {"group": 1, "obs": ["x"]},
        ]
    )
    b["admissible_key"] = np.array([7, 8, 7, 7], dtype=np.uint64)
    adv = compute_advantages("graphgpo", b, norm="mean", state_key="observation_actions")
    # group 0: x and y are singleton sources -> A^G = 0; group 1: both leave x|7, win vs. unreachable
    r_win, r_fail = 10.0, 10 * 0.1**2  # d(sink) = 0; failed last step: d_max + 1 = d(x|7) + 1 = 2
    mid = (r_win + r_fail) / 2
    np.testing.assert_allclose(adv, [5.0, -5.0, 5.0 + r_win - mid, -5.0 + r_fail - mid], atol=1e-12)


def test_batch_keeps_admissible_key_in_canonical_order():
    cols = _aliased_batch()
    perm = np.array([3, 0, 2, 1])
    shuffled = {k: v[perm] for k, v in cols.items()}
    shuffled["admissible_key"] = np.array([40, 10, 30, 20], dtype=np.uint64)  # a0=10 a1=20 b0=30 b1=40
    steps = StepBatch.from_columns(shuffled)
    assert steps.admissible.dtype == np.uint64
    assert steps.admissible.tolist() == [10, 20, 30, 40]  # canonical: a0 a1 b0 b1
    assert steps.rows(2, 4).admissible.tolist() == [30, 40]
    no_column = StepBatch.from_columns({k: v for k, v in cols.items() if k != "admissible_key"})
    assert no_column.admissible is None
    assert StepBatch.from_columns({**cols, "admissible_key": None}).admissible is None


def test_batch_validates_admissible_key():
    cols = _aliased_batch()
    with pytest.raises(ValueError, match="mismatched lengths"):
        StepBatch.from_columns({**cols, "admissible_key": np.zeros(3, dtype=np.uint64)})
    with pytest.raises(ValueError, match="column 'admissible_key'"):
        StepBatch.from_columns({**cols, "admissible_key": np.zeros(4)})
