"""``check_text_env``: the toy envs pass it; each broken rule of the text-env contract fails it by name."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from progpo_envs.core.checker import INFO_KEYS, REQUIRED_KEYS, check_text_env
from progpo_envs.core.text_env import EngineStep
from progpo_envs.testing import (
    COUNTER_ENV_ID,
    DRAWER_ENV_ID,
    KEY_DOOR_ENV_ID,
    TOY_ALFWORLD_ENV_ID,
    TOY_WEBSHOP_ENV_ID,
    KeyDoorEnv,
)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        (COUNTER_ENV_ID, {}),
        (COUNTER_ENV_ID, {"history_depths": (1, 2)}),
        (KEY_DOOR_ENV_ID, {}),
        (TOY_ALFWORLD_ENV_ID, {"expert": True, "history_depths": (2,)}),
        (TOY_WEBSHOP_ENV_ID, {"expert": True}),
        (DRAWER_ENV_ID, {"expert": True, "history_depths": (1,)}),
    ],
)
def test_the_toy_envs_keep_the_text_env_contract(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    check_text_env(env.unwrapped)
    env.close()


def test_the_contract_names_every_key_it_requires():
    assert set(REQUIRED_KEYS) <= set(INFO_KEYS)


class _NoWon(KeyDoorEnv):
    def _info(self) -> dict:
        return {k: v for k, v in super()._info().items() if k != "won"}

    def _engine_step(self, action: str) -> EngineStep:
        step = super()._engine_step(action)
        return EngineStep(step.observation, step.reward, step.terminated, self._info())


class _StringActions(KeyDoorEnv):
    def _info(self) -> dict:
        return {**super()._info(), "admissible_actions": "go left, go right"}


class _RaisesOnMalformed(KeyDoorEnv):
    def _invalid_action_step(self) -> EngineStep:
        raise ValueError("empty action")


class _BadScore(KeyDoorEnv):
    def _info(self) -> dict:
        return {**super()._info(), "task_score": 10.0}


class _SeedlessReset(KeyDoorEnv):
    def _start_task(self, task_index: int):
        start = super()._start_task(task_index)
        start.observation += (
            f" ({np.random.default_rng().integers(1 << 30)})"  # not from the seeded np_random
        )
        return start


class _NoLatch(KeyDoorEnv):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if self._ended:
            return observation, 1.0, terminated, truncated, info
        self._ended = terminated or truncated
        return observation, reward, terminated, truncated, info

    def reset(self, **kwargs):
        self._ended = False
        return super().reset(**kwargs)


class _BadStyle(KeyDoorEnv):
    metadata = {**KeyDoorEnv.metadata, "prompt_style": 3}


class _BadFlavor(KeyDoorEnv):
    metadata = {**KeyDoorEnv.metadata, "agentgym_flavor": "babyai"}


class _BadObservation(KeyDoorEnv):
    metadata = {**KeyDoorEnv.metadata, "openenv_observation": "pixels"}


class _BadTaskTypes(KeyDoorEnv):
    metadata = {**KeyDoorEnv.metadata, "task_types": "keys and doors"}


@pytest.mark.parametrize(
    ("env_class", "message"),
    [
        (_NoWon, r"info lacks \['won'\]"),
        (_StringActions, "admissible_actions'] must be a list of str"),
        (_RaisesOnMalformed, "a malformed action is an invalid one"),
        (_BadScore, r"task_score'] must be a number in \[0, 1\]"),
        (_SeedlessReset, "same seed"),  # Gymnasium's checker or ours
        (_NoLatch, "an ended episode must return its final observation, reward 0"),
        (_BadStyle, "prompt_style'] must be a style's name"),
        (_BadFlavor, "agentgym_flavor'] must be one of"),
        (_BadObservation, "openenv_observation'] must be one of"),
        (_BadTaskTypes, "task_types'] must be a sequence of names"),
    ],
)
def test_a_broken_rule_fails_by_name(env_class, message):
    with pytest.raises(AssertionError, match=message):
        check_text_env(env_class(num_tasks=2, rooms=2, max_steps=12))
