"""The TextEnv base class, through the toy counter env (:class:`progpo_envs.testing.CounterEnv`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from progpo_envs.testing import CounterEnv


def test_check_env_passes():
    check_env(CounterEnv(), skip_render_check=True)


def test_task_index_option_and_seeded_choice():
    env = CounterEnv()
    obs, info = env.reset(options={"task_index": 3})
    assert (
        obs == "Count to 5. The counter is at 0." and info["task_index"] == 3 and info["task_id"] == "count-5"
    )
    picked = [CounterEnv().reset(seed=s)[1]["task_index"] for s in range(20)]
    assert picked == [CounterEnv().reset(seed=s)[1]["task_index"] for s in range(20)]
    assert len(set(picked)) > 1
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"task_index": CounterEnv.NUM_TASKS})


def test_step_before_reset_raises():
    with pytest.raises(gym.error.ResetNeeded):
        CounterEnv().step("inc")


def test_win_terminates_and_the_episode_latches_without_stepping_the_engine():
    env = CounterEnv()
    env.reset(options={"task_index": 0})  # target 2
    env.step("inc")
    obs, reward, terminated, truncated, info = env.step("inc")
    assert (obs, reward, terminated, truncated) == ("The counter is at 2.", 1.0, True, False)
    engine_steps = env.engine_steps
    for action in ("inc", "dec", ""):
        again = env.step(action)
        assert again[:4] == (obs, 0.0, True, False)
        assert again[4]["history_key"] == info["history_key"]
    assert env.engine_steps == engine_steps and env.elapsed_steps == 2


def test_truncation_at_max_steps_latches():
    env = CounterEnv(max_steps=3)
    env.reset(options={"task_index": 4})
    flags = [env.step("noop")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    assert env.step("inc")[2:4] == (False, True) and env.engine_steps == 3


def test_winning_on_the_last_step_is_terminated_not_truncated():
    env = CounterEnv(max_steps=2)
    env.reset(options={"task_index": 0})
    env.step("inc")
    assert env.step("inc")[2:4] == (True, False)


@pytest.mark.parametrize("action", ["", "   ", "x" * 5000, "go\x00to", "\x1b[2J", b"inc", None, 7, ["inc"]])
def test_malformed_actions_are_invalid_actions_not_errors(action):
    env = CounterEnv()
    env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert (obs, reward, terminated, truncated) == ("Nothing happens.", 0.0, False, False)
    assert env.invalid_steps == 1 and env.engine_steps == 0 and env.elapsed_steps == 1
    assert env.observation_space.contains(obs) and isinstance(info["history_key"], np.uint64)


def test_infos_carry_history_keys_and_same_seed_gives_same_keys():
    def run():
        env = CounterEnv(history_depths=(1, 2))
        _, info = env.reset(seed=7)
        infos = [info] + [env.step(a)[4] for a in ("inc", "look", "inc")]
        return infos

    a, b = run(), run()
    assert [i["history_key"] for i in a] == [i["history_key"] for i in b]
    assert [i["history_keys"] for i in a] == [i["history_keys"] for i in b]
    assert len({int(i["history_key"]) for i in a}) == len(a)
    assert a[1]["history_keys"][1] == a[1]["history_key"] and a[3]["history_keys"][1] != a[3]["history_key"]


def test_render_ansi_returns_last_observation():
    env = CounterEnv(render_mode="ansi")
    assert env.render() is None
    obs, _ = env.reset(options={"task_index": 1})
    assert env.render() == obs
    assert CounterEnv().render() is None


@pytest.mark.parametrize("action", ["inc\n", "  inc", "inc\t\r\n"])
def test_surrounding_whitespace_is_stripped_not_invalid(action):
    env = CounterEnv()
    env.reset(options={"task_index": 0})
    observation, *_ = env.step(action)
    assert env.engine_steps == 1 and env.invalid_steps == 0
    assert observation == "The counter is at 1."
