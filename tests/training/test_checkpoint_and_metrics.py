"""Atomic checkpoints, metric helpers and DAPO's group filter."""

from __future__ import annotations

import json

import numpy as np
import torch

from training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
)
from training.metrics import MetricsLog, episode_metrics, exact_prefix_peer_fraction
from training.rollout import Episode, RolloutResult, StepRows, mixed_outcome_groups
from training.seeds import derive_seed


def _save(root, iteration, keep=2):
    def save_model(path):
        torch.save({"w": torch.ones(2) * iteration}, path)

    return save_checkpoint(
        root,
        iteration,
        save_model=save_model,
        optimizer_state={"step": iteration},
        state={"stage": "rl"},
        config={"seed": 0},
        keep=keep,
    )


def test_checkpoints_are_complete_pointed_to_and_pruned(tmp_path):
    for iteration in range(4):
        _save(tmp_path, iteration)
    assert latest_checkpoint(tmp_path).name == "iter_000003"
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_000002", "iter_000003"]
    assert not list(tmp_path.glob(".tmp-*"))
    verify_checkpoint(tmp_path / "iter_000002")  # every kept checkpoint has a manifest that matches it
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path))
    assert checkpoint.state == {"stage": "rl", "iteration": 3} and checkpoint.optimizer_state == {"step": 3}
    assert checkpoint.model_state["w"].tolist() == [3.0, 3.0]
    # RNG states restore exactly
    set_rng_state(checkpoint.rng_state)
    first = torch.rand(3)
    set_rng_state(checkpoint.rng_state)
    assert torch.equal(first, torch.rand(3))


def test_half_written_checkpoint_is_ignored(tmp_path):
    _save(tmp_path, 1)
    broken = tmp_path / ".tmp-iter_000002-999"
    broken.mkdir()
    (broken / "model.pt").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "iter_000001"


def test_metrics_log_truncates_after_resume_point(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for iteration in range(5):
        log.write({"kind": "train", "iteration": iteration, "loss": float(iteration), "nan": float("nan")})
    log.truncate_after(2)
    records = log.read()
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert records[0]["nan"] is None  # NaN is written as null (valid JSON)
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])


def test_episode_metrics_per_task_type():
    episodes = [
        Episode(0, 0, "a", "pick", True, 10.0, 3, 0),
        Episode(0, 1, "a", "pick", False, 0.0, 5, 1),
        Episode(1, 2, "b", "heat", False, 0.0, 4, 4),
    ]
    m = episode_metrics(episodes)
    assert m["success"] == 1 / 3 and m["success/pick"] == 0.5 and m["success/heat"] == 0.0
    assert m["invalid_rate"] == 5 / 12 and m["episode_steps"] == 4.0
    assert m["success_steps"] == 3.0  # steps to success: the one won episode's length
    assert "success_steps" not in episode_metrics(episodes[1:])  # nothing won: no steps to success
    assert "task_score" not in m  # ALFWorld reports no task score of its own


def test_episode_metrics_average_the_envs_task_score():
    # WebShop: the reward may be success-only while the purchase score is partial
    episodes = [
        Episode(0, 0, "a", "", False, 0.0, 3, 0, task_score=0.5),
        Episode(0, 1, "a", "", True, 10.0, 5, 0, task_score=1.0),
    ]
    m = episode_metrics(episodes)
    assert m["task_score"] == 0.75 and m["score"] == 5.0 and m["success"] == 0.5
    assert not [k for k in m if k.startswith("success/")]  # untyped goals: no per-type entry


def test_exact_prefix_peer_fraction_counts_shared_prefixes_within_groups():
    rows = StepRows.empty()
    # group 0: trajs 0 and 1 share their first state; group 1 has the same key but is another group
    for group, traj, key in [(0, 0, 7), (0, 1, 7), (0, 0, 8), (1, 2, 7)]:
        rows.group_id.append(group)
        rows.traj_id.append(traj)
        rows.history_key.append(key)
    assert exact_prefix_peer_fraction(rows) == 0.5


def test_dynamic_sampling_keeps_only_groups_with_different_outcomes():
    rows = StepRows.empty()
    rows.group_id.extend([0, 0, 1, 1])
    episodes = [
        Episode(0, 0, "a", "t", True, 10.0, 1, 0),
        Episode(0, 1, "a", "t", False, 0.0, 1, 0),
        Episode(1, 2, "b", "t", False, 0.0, 1, 0),
        Episode(1, 3, "b", "t", False, 0.0, 1, 0),
    ]
    keep_rows, keep_groups = mixed_outcome_groups(RolloutResult(rows, episodes))
    assert keep_groups == {0} and keep_rows == [0, 1]


def test_derived_seeds_are_stable_and_distinct():
    assert derive_seed(0, "tasks", 3) == derive_seed(0, "tasks", 3)
    assert len({derive_seed(0, "tasks", i) for i in range(100)}) == 100
    assert derive_seed(1, "x") != derive_seed(0, "x")
    assert isinstance(np.random.default_rng(derive_seed(0, "a")).integers(10), np.integer)
