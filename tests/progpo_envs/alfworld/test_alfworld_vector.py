"""Group vectorisation of ALFWorld through ``gymnasium.make_vec``, in-process and in subprocesses."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.core.vector import GroupVectorEnv


@pytest.fixture(scope="module", params=["sync", "async"])
def envs(request, shared_alfworld_data, progpo_cache):
    """One vector env per mode for the module (every test resets it first)."""
    # ``spawn`` workers start from this process's environment (the session's $PROGPO_CACHE), whatever
    # multiprocessing start method earlier tests used.
    vector = gym.make_vec(
        "progpo/ALFWorld-v0",
        num_envs=4,
        group_size=2,
        vector_mode=request.param,
        num_workers=2,
        mp_context="spawn",
        split="valid_seen",
        data_dir=shared_alfworld_data,
        max_steps=6,
        expert=True,
    )
    yield vector
    vector.close()


def test_groups_share_tasks_and_report_group_and_task_ids(envs):
    assert isinstance(envs, GroupVectorEnv) and envs.num_envs == 4
    obs, info = envs.reset(seed=21)
    assert info["group_id"].tolist() == [0, 0, 1, 1]
    task_ids = info["task_id"].tolist()
    assert task_ids[0] == task_ids[1] and task_ids[2] == task_ids[3]
    assert obs[0] == obs[1] and obs[2] == obs[3]
    assert info["history_key"][0] == info["history_key"][1]
    _, info = envs.reset(options={"task_indices": [5, 9]})
    tasks = envs.get_attr("tasks")[0]
    assert info["task_id"].tolist() == [tasks[5].task_id] * 2 + [tasks[9].task_id] * 2


def test_copies_diverge_and_ended_copies_latch(envs):
    _, info = envs.reset(options={"task_indices": [5, 5]})
    # copy 0 follows the expert, copy 1 idles, copies 2-3 take the same wrong turn.
    finished_at = None
    for t in range(6):
        actions = [info["expert_action"][0], "look", "inventory", "inventory"]
        obs, rewards, terminated, truncated, info = envs.step(actions)
        if terminated[0] and finished_at is None:
            finished_at, final_obs, final_key = t, obs[0], info["history_key"][0]
            assert rewards[0] == 10.0 and info["won"][0]
        elif finished_at is not None:
            assert terminated[0] and rewards[0] == 0.0 and obs[0] == final_obs
            assert info["history_key"][0] == final_key
        assert obs[2] == obs[3] and info["history_key"][2] == info["history_key"][3]
    assert finished_at is not None and finished_at < 5
    assert not terminated[1:].any() and truncated[1:].all()
    assert info["history_key"][0] != info["history_key"][1]
    obs, rewards, terminated, truncated, _ = envs.step(["look"] * 4)  # all ended: nothing moves
    assert (terminated | truncated).all() and not rewards.any()


def test_malformed_actions_in_a_vector(envs):
    envs.reset(seed=0)
    obs, rewards, terminated, truncated, info = envs.step(["", "x" * 50_000, "\x00", "jump"])
    assert obs == ("Nothing happens.",) * 4 and not terminated.any() and not truncated.any()
    assert np.all(rewards == 0.0)
