"""The credit-assignment diagnostics: hand-computed metrics on a 4-row batch, recording, JSONL, the CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from benchmarks import credit_diagnostics
from benchmarks.lib import credit as cd
from progpo_envs.core.hashing import action_set_key
from training.advantages import progpo_report

# One task group, two rollouts of a 2-cell corridor (obs "A" = 2 steps from the goal, "B" = 1 step):
#   rollout 0: A -forward-> B -forward-> won (reward 10)
#   rollout 1: A -wait-> A -forward-> B, truncated (failed)
TINY = [
    cd.StepRow(0, 0, 0, "A", "forward", 0.0, False, True, "forward", 1.0),
    cd.StepRow(0, 0, 1, "B", "forward", 10.0, True, True, "forward", 1.0),
    cd.StepRow(0, 1, 0, "A", "wait", 0.0, False, True, "forward", 0.0),
    cd.StepRow(0, 1, 1, "A", "forward", 0.0, False, True, "forward", 1.0),
]


def test_peer_fractions_by_hand():
    # Exact prefix: both step-0 rows share (A); the step-1 histories (A,forward,B) and (A,wait,A) are unique.
    # Anchor: "A" occurs 3 times, "B" once.
    assert cd.peer_fractions(TINY) == {"exact_prefix_peer_fraction": 0.5, "anchor_peer_fraction": 0.75}
    assert progpo_report(cd.rows_to_batch(TINY))["peer_fraction"] == 0.5


def test_gigpo_step_signal_by_hand():
    # Step returns (gamma 0.95): 9.5, 10, 0, 0. Anchor group A = {9.5, 0, 0}, mean 19/6 -> A^S = 19/3, -19/6,
    # -19/6; B is a singleton -> 0 (norm="mean", so no std division).
    batch = cd.rows_to_batch(TINY)
    params = {"norm": "mean"}
    adv = cd.compute_advantages("gigpo", batch, **params)
    step = cd.step_signal("gigpo", batch, adv, params)
    np.testing.assert_allclose(step, [19 / 3, 0.0, -19 / 6, -19 / 6], atol=1e-9)


def test_metrics_by_hand():
    m = cd.estimator_metrics("gigpo", TINY, {"norm": "mean"})
    assert m["nonzero_step_fraction"] == 0.75
    # Non-zero step rows: x = (19/3, -19/6, -19/6), progress y = (1, 0, 1): Pearson = (57/18) /
    # sqrt(1083/18 * 6/9)
    assert m["step_corr_progress"] == pytest.approx(0.5)
    # Signed rows (step != 0, progress != 0): +19/3 with +1 (right), -19/6 with +1 (wrong).
    assert m["step_sign_accuracy"] == 0.5
    assert m["step_var"] == pytest.approx(np.var([19 / 3, 0, -19 / 6, -19 / 6]))
    grpo = cd.estimator_metrics("grpo", TINY, {"norm": "mean"})
    assert (
        grpo["nonzero_step_fraction"] == 0.0
        and grpo["step_var"] == 0.0
        and grpo["step_sign_accuracy"] is None
    )
    # GRPO, mean norm: scores 10, 10, 0, 0 (cross-steps) -> +5, +5, -5, -5; expert agreement 1, 1, 0, 1.
    assert grpo["advantage_var"] == pytest.approx(25.0)
    assert grpo["corr_expert"] == pytest.approx(np.corrcoef([5, 5, -5, -5], [1, 1, 0, 1])[0, 1])


def test_batch_stats_by_hand():
    stats = cd.batch_stats(TINY)
    assert stats["rows"] == 4 and stats["trajectories"] == 2 and stats["groups"] == 1
    assert stats["success_rate"] == 0.5
    assert stats["expert_agreement"] == 0.75
    assert stats["mean_progress"] == 0.75


def test_estimator_spec_parsing():
    assert cd.parse_estimator_spec("gigpo") == ("gigpo", {})
    assert cd.parse_estimator_spec("progpo:step_weight=0.5,norm=mean") == (
        "progpo",
        {"step_weight": 0.5, "norm": "mean"},
    )
    with pytest.raises(ValueError, match="unknown estimator"):
        cd.parse_estimator_spec("nope")
    with pytest.raises(ValueError, match="key=value"):
        cd.parse_estimator_spec("gigpo:step_weight")
    with pytest.raises(ValueError, match="'omega' was renamed; use 'step_weight'"):
        cd.parse_estimator_spec("progpo:omega=0.5")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['gama'\]"):
        cd.parse_estimator_spec("gigpo:gama=0.9")


@pytest.mark.parametrize("name", sorted(cd.ESTIMATORS))
def test_every_estimators_step_signal_leaves_its_trajectory_level_part(name):
    # The step signal is A minus the estimator with its registration's episode_only parameters: what is left
    # is the same on every row of a trajectory (TINY's rows are all valid), and an estimator with a step term
    # has a non-zero step signal on TINY (its rollouts revisit A: anchors, peers and a graph to compare on).
    batch = cd.rows_to_batch(TINY)
    adv = cd.compute_advantages(name, batch)
    step = cd.step_signal(name, batch, adv)
    episode = adv - step
    for traj in (0, 1):
        rows = batch["traj_id"] == traj
        np.testing.assert_allclose(episode[rows], episode[rows][0], atol=1e-9)
    assert (np.abs(step).max() > 1e-6) == bool(cd.ESTIMATORS[name].episode_only)


def test_record_group_expert_only_is_optimal(corridor_env):
    rows = cd.record_group(
        corridor_env, 1, 3, 0.0, [0], lambda e: e.unwrapped.distance(), group_id=0, first_traj_id=0
    )
    assert len(rows) == 3 * 3  # corridor of 3, three rollouts
    assert all(r.action == "forward" and r.progress == 1.0 for r in rows)
    assert [r.won for r in rows if r.traj_id == 0] == [False, False, True]
    assert cd.peer_fractions(rows)["exact_prefix_peer_fraction"] == 1.0


def test_record_group_noisy_is_seeded_and_labelled(corridor_env):
    dist = lambda e: e.unwrapped.distance()  # noqa: E731
    a = cd.record_group(corridor_env, 2, 4, 0.6, [7, 1], dist, group_id=3, first_traj_id=12)
    b = cd.record_group(corridor_env, 2, 4, 0.6, [7, 1], dist, group_id=3, first_traj_id=12)
    c = cd.record_group(corridor_env, 2, 4, 0.6, [8, 1], dist, group_id=3, first_traj_id=12)
    assert a == b and a != c
    assert {r.traj_id for r in a} == {12, 13, 14, 15} and {r.group_id for r in a} == {3}
    expected_progress = {"forward": 1.0, "wait": 0.0}
    for r in a:
        if r.action == "back":  # back from cell 0 stays, otherwise undoes a step
            assert r.progress in (0.0, -1.0)
        else:
            assert r.progress == expected_progress[r.action]
    assert any(r.action != "forward" for r in a)


def test_jsonl_round_trip_and_errors(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    cd.save_rollouts_jsonl(TINY, path)
    assert cd.load_rollouts_jsonl(path) == TINY
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"group_id": 0, "traj_id": 0, "step": 0}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing key"):
        cd.load_rollouts_jsonl(bad)
    bad.write_text("\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object"):
        cd.load_rollouts_jsonl(bad)


def test_main_on_a_rollout_file(tmp_path):
    path = tmp_path / "warm.jsonl"
    cd.save_rollouts_jsonl(TINY, path)
    out = tmp_path / "diag.json"
    assert (
        credit_diagnostics.main(
            [
                "--sources",
                "--rollouts",
                str(path),
                "--estimators",
                "grpo",
                "gigpo:norm=mean",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    entry = result["sources"]["rollouts"]["warm.jsonl"]
    assert entry["batch"]["exact_prefix_peer_fraction"] == 0.5
    assert entry["estimators"]["gigpo:norm=mean"]["nonzero_step_fraction"] == 0.75
    assert result["machine"]["cpu_count"] >= 1 and "commit" in result["git"]
    assert result["config"]["estimators"] == ["grpo", "gigpo:norm=mean"]


def test_alfworld_expert_rollouts_make_progress_every_step():
    # The plan-length oracle on the real engine: following the expert shortens its plan by exactly one step
    # each time and wins; random admissible actions give integer progress labels (0 for most detours).
    env, distance = cd.alfworld_source(max_steps=20)
    try:
        (task, _), *_ = cd.alfworld_tasks(env, per_type=1)
        rows = cd.record_group(env, task, 1, 0.0, [0], distance, group_id=0, first_traj_id=0)
        assert rows[-1].won and all(r.progress == 1.0 for r in rows)
        noisy = cd.record_group(env, task, 1, 0.5, [1], distance, group_id=1, first_traj_id=1)
        assert all(r.progress is not None and float(r.progress).is_integer() for r in noisy)
        assert any(r.action != r.expert_action for r in noisy)
    finally:
        env.close()


def test_recorded_rows_carry_the_admissible_set_key(corridor_env):
    rows = cd.record_group(corridor_env, 0, 2, 0.5, [3], None, group_id=0, first_traj_id=0)
    assert {r.admissible_key for r in rows} == {int(action_set_key(["wait", "forward", "back"]))}
    batch = cd.rows_to_batch(rows)
    assert batch["admissible_key"].dtype == np.uint64 and batch["admissible_key"].shape == (len(rows),)


def test_jsonl_admissible_key_round_trip_and_older_files(tmp_path):
    keyed = [dataclasses.replace(r, admissible_key=2**64 - 1 - i) for i, r in enumerate(TINY)]
    path = tmp_path / "keyed.jsonl"
    cd.save_rollouts_jsonl(keyed, path)
    assert json.loads(path.read_text().splitlines()[0])["admissible_key"] == "ffffffffffffffff"
    assert cd.load_rollouts_jsonl(path) == keyed
    assert cd.rows_to_batch(keyed)["admissible_key"].tolist() == [2**64 - 1 - i for i in range(4)]
    # a file written before the field existed: rows without the key, batch without the column
    old = tmp_path / "old.jsonl"
    old.write_text(
        "".join(
            json.dumps({k: v for k, v in dataclasses.asdict(r).items() if k != "admissible_key"}) + "\n"
            for r in TINY
        )
    )
    rows = cd.load_rollouts_jsonl(old)
    assert rows == TINY and "admissible_key" not in cd.rows_to_batch(rows)
    with pytest.raises(ValueError, match="admissible_key"):
        cd.estimator_metrics("graphgpo", rows, {"state_key": "observation_actions"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**dataclasses.asdict(TINY[0]), "admissible_key": "not hex"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: admissible_key must be 16 hex digits"):
        cd.load_rollouts_jsonl(bad)
