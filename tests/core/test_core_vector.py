"""GroupVectorEnv with the toy env, in-process and in subprocesses."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from progpo_envs.core.registration import register_text_env
from progpo_envs.core.vector import GroupVectorEnv

TOY_ID = "progpo-test/Toy-v0"
register_text_env(TOY_ID, "toy_env:ToyEnv")

MODES = ["sync", "async"]


@pytest.fixture(params=MODES)
def vector_mode(request) -> str:
    return request.param


def make(vector_mode: str, num_envs: int = 6, group_size: int = 2, **kwargs) -> GroupVectorEnv:
    return gym.make_vec(
        TOY_ID, num_envs=num_envs, group_size=group_size, vector_mode=vector_mode, num_workers=2, **kwargs
    )


def test_make_vec_builds_a_group_vector_env(vector_mode):
    envs = make(vector_mode)
    try:
        assert isinstance(envs, GroupVectorEnv) and envs.num_envs == 6 and envs.num_groups == 3
        assert envs.metadata["autoreset_mode"] is AutoresetMode.DISABLED
        assert envs.observation_space.contains(("a",) * 6)
    finally:
        envs.close()


def test_groups_share_tasks_and_info_has_group_and_task_ids(vector_mode):
    envs = make(vector_mode)
    try:
        obs, info = envs.reset(seed=11)
        assert info["group_id"].tolist() == [0, 0, 1, 1, 2, 2]
        task_ids = info["task_id"].tolist()
        for g in range(3):
            assert task_ids[2 * g] == task_ids[2 * g + 1] and obs[2 * g] == obs[2 * g + 1]
            assert info["history_key"][2 * g] == info["history_key"][2 * g + 1]
        obs2, info2 = envs.reset(seed=11)
        assert obs2 == obs and info2["task_id"].tolist() == task_ids
        _, info3 = envs.reset(options={"task_indices": [4, 0, 2]})
        assert info3["task_id"].tolist() == ["count-6"] * 2 + ["count-2"] * 2 + ["count-4"] * 2
        _, info4 = envs.reset(options={"task_index": 1})
        assert set(info4["task_id"].tolist()) == {"count-3"}
    finally:
        envs.close()


def test_ended_copies_latch_until_reset(vector_mode):
    envs = make(vector_mode, num_envs=4, group_size=2, max_steps=4)
    try:
        envs.reset(
            options={"task_indices": [0, 3]}
        )  # group 0 counts to 2, group 1 to 5 (unreachable in 4 steps)
        envs.step(["inc", "look", "inc", "inc"])
        obs, rewards, term, trunc, info = envs.step(["inc", "look", "inc", "inc"])
        assert term.tolist() == [True, False, False, False] and rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
        final_obs, final_key = obs[0], info["history_key"][0]
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)
        assert term.tolist() == [True, False, False, False] and rewards.tolist() == [0.0] * 4
        assert obs[0] == final_obs and info["history_key"][0] == final_key
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)
        assert term.tolist() == [True, True, False, False] and trunc.tolist() == [False, False, True, True]
        assert rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)  # everything ended: nothing moves
        assert (term | trunc).all() and rewards.sum() == 0.0
        assert list(envs.call("engine_steps")) == [2, 4, 4, 4]
        envs.reset(options={"task_indices": [0, 0]})
        assert not envs.step(["look"] * 4)[2].any()
    finally:
        envs.close()


def test_seedless_resets_draw_group_seeds_from_the_vector_generator(vector_mode):
    envs = make(vector_mode, num_envs=4, group_size=2)
    try:
        envs.reset(seed=3)
        _, a = envs.reset()
        envs.reset(seed=3)
        _, b = envs.reset()
        assert a["task_id"].tolist() == b["task_id"].tolist()
        assert a["task_id"][0] == a["task_id"][1] and a["task_id"][2] == a["task_id"][3]
    finally:
        envs.close()


def test_sync_and_async_give_identical_rollouts():
    results = []
    for mode in MODES:
        envs = make(mode, num_envs=4, group_size=2, history_depths=(1,))
        try:
            obs, info = envs.reset(seed=5)
            steps = [envs.step(["inc", "look", "dec", "inc"]) for _ in range(3)]
            results.append(
                (
                    obs,
                    info["history_key"].tolist(),
                    [(s[0], s[1].tolist(), s[4]["history_key"].tolist()) for s in steps],
                )
            )
        finally:
            envs.close()
    assert results[0] == results[1]


def test_bad_arguments(vector_mode):
    with pytest.raises(ValueError, match="multiple"):
        make(vector_mode, num_envs=5, group_size=2)
    envs = make(vector_mode, num_envs=2, group_size=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="expected 2 actions"):
            envs.step(["inc"])
        with pytest.raises(ValueError, match="task_indices"):
            envs.reset(options={"task_indices": [0]})
        assert envs.get_attr("num_tasks") == (5, 5)
    finally:
        envs.close()


def test_async_worker_errors_are_reported():
    envs = make("async", num_envs=2, group_size=1)
    try:
        with pytest.raises(RuntimeError, match="out of range"):
            envs.reset(options={"task_index": 99})
    finally:
        envs.close()


def test_malformed_actions_in_a_vector(vector_mode):
    envs = make(vector_mode, num_envs=2, group_size=2)
    try:
        envs.reset(seed=0)
        obs, rewards, term, trunc, _ = envs.step(["", "x" * 10_000])
        assert obs == ("Nothing happens.", "Nothing happens.") and not term.any() and not trunc.any()
    finally:
        envs.close()


def test_info_masks_are_present():
    envs = make("sync", num_envs=2, group_size=1)
    try:
        _, info = envs.reset(seed=0)
        assert info["_group_id"].all() and info["_task_id"].all()
        assert info["history_key"].dtype == np.uint64 or info["history_key"].dtype == object
    finally:
        envs.close()
