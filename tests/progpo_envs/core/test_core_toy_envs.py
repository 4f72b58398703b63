"""The package's toy envs (``progpo_envs.testing``): registered by id, and valid Gymnasium text envs."""

from __future__ import annotations

import gymnasium as gym
import pytest

from progpo_envs.core.checker import check_text_env
from progpo_envs.core.vector import GroupVectorEnv
from progpo_envs.testing import (
    COUNTER_ENV_ID,
    DRAWER_ENV_ID,
    KEY_DOOR_ENV_ID,
    TOY_ALFWORLD_ENV_ID,
    TOY_WEBSHOP_ENV_ID,
)

TOY_ENV_IDS = [COUNTER_ENV_ID, KEY_DOOR_ENV_ID, TOY_ALFWORLD_ENV_ID, TOY_WEBSHOP_ENV_ID, DRAWER_ENV_ID]


@pytest.mark.parametrize("env_id", TOY_ENV_IDS)
def test_toy_env_keeps_the_text_env_contract_and_groups_by_id(env_id):
    env = gym.make(env_id)
    try:
        check_text_env(env.unwrapped)  # Gymnasium's check_env and the project's info contract
        assert env.unwrapped.num_tasks >= 1
    finally:
        env.close()
    envs = gym.make_vec(env_id, num_envs=4, group_size=2)
    try:
        assert isinstance(envs, GroupVectorEnv)
        observations, info = envs.reset(seed=3)
        assert observations[0] == observations[1] and observations[2] == observations[3]
        assert info["task_id"][0] == info["task_id"][1]
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("env_id", "plan"),
    [
        (COUNTER_ENV_ID, ["inc", "inc"]),
        (KEY_DOOR_ENV_ID, ["take key", "go right", "go right", "go right", "go right", "open door"]),
        (
            TOY_ALFWORLD_ENV_ID,
            ["go to desk 1", "take mug 1 from desk 1", "go to countertop 1", "move mug 1 to countertop 1"],
        ),
        (DRAWER_ENV_ID, ["take key 1", "move key 1 to drawer 1"]),
    ],
)
def test_toy_env_task_zero_is_won_by_its_plan(env_id, plan):
    env = gym.make(env_id)
    env.reset(seed=0, options={"task_index": 0})
    rewards, terminated = [], False
    for action in plan:
        _, reward, terminated, _, _ = env.step(action)
        rewards.append(reward)
    env.close()
    assert terminated and rewards[-1] > 0 and all(r == 0 for r in rewards[:-1])
