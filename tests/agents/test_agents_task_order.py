"""Partial evaluations cover every task type by default (``--task-order stratified``), and reports name the
split the env really played."""

from __future__ import annotations

import json

import gymnasium as gym

from agents.evaluate import EvalConfig, TaskOrder, evaluate, stratified_order, task_selection


def test_stratified_order_takes_each_type_in_turn():
    types = ["clean"] * 3 + ["heat"] * 2 + ["put"]
    assert stratified_order(types) == [0, 3, 5, 1, 4, 2]
    assert sorted(stratified_order(types)) == list(range(len(types)))  # a permutation: a full run plays all
    assert stratified_order([]) == []


def test_partial_alfworld_run_covers_every_task_type(tmp_path):
    envs = gym.make_vec("progpo/ALFWorld-v0", num_envs=1, group_size=1, split="train")
    try:
        sequential = task_selection(envs, 6, TaskOrder.SEQUENTIAL)
        stratified = task_selection(envs, 6, TaskOrder.STRATIFIED)
        types = [task.task_type for task in envs.call("tasks")[0]]
    finally:
        envs.close()
    assert sequential == [0, 1, 2, 3, 4, 5] and len({types[t] for t in sequential}) == 1  # the old behaviour
    assert len({types[t] for t in stratified}) == 6
    summary = evaluate(
        EvalConfig(
            env_id="progpo/ALFWorld-v0", agent="expert", out_dir=str(tmp_path), split="train", episodes=6
        ),
        progress=False,
    )
    assert len(summary["per_task_type"]) == 6 and summary["success_rate"] == 1.0
    played = sorted(json.loads(line)["task_index"] for line in (tmp_path / "trajectories.jsonl").open())
    assert played == sorted(stratified)


def test_report_names_the_split_the_env_played(tmp_path):
    summary = evaluate(
        EvalConfig(env_id="progpo/WebShop-v0", agent="expert", out_dir=str(tmp_path), episodes=1),
        progress=False,
    )
    assert summary["split"] == "train"  # WebShop's default split, not "default"
    assert "split: `train`" in (tmp_path / "report.md").read_text()
