"""Partial evaluations cover every task type by default (``--task-order stratified``), and reports name the
split the env really played."""

from __future__ import annotations

import json

import gymnasium as gym

from agents.envs import spread_tasks
from agents.evaluate import EvalConfig, TaskOrder, evaluate, stratified_order, task_selection
from training.config import load_config
from training.envs import make_split_envs


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


def test_spread_order_plays_the_trainers_held_out_tasks():
    """``--task-order spread --episodes N`` scores a served checkpoint on the tasks ``progpo train``'s
    held-out evaluation plays with ``eval.num_tasks=N`` (the served checkpoint against the trainer's own)."""
    config = load_config(None)
    envs = make_split_envs(config.env, config.env.eval_split, 1, 1)
    try:
        spread = task_selection(envs, 8, TaskOrder.SPREAD)
        assert spread == spread_tasks(envs.call("num_tasks")[0], 8)
        types = [task.task_type for task in envs.call("tasks")[0]]
    finally:
        envs.close()
    assert len(set(spread)) == 8 and len({types[t] for t in spread}) == 2  # both of the quickstart's types


def test_report_names_the_split_the_env_played(tmp_path):
    summary = evaluate(
        EvalConfig(env_id="progpo/WebShop-v0", agent="expert", out_dir=str(tmp_path), episodes=1),
        progress=False,
    )
    assert summary["split"] == "train"  # WebShop's default split, not "default"
    assert "split: `train`" in (tmp_path / "report.md").read_text()
