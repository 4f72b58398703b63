"""``progpo/WebShop-v0``: the Gymnasium contract, task selection, rewards, the expert, vectorisation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.core.checker import check_text_env
from progpo_envs.webshop.env import DEFAULT_MAX_STEPS, SUCCESS_REWARD, WebShopEnv
from tests.webshop_server.shop_fixtures import make_tiny_engine


def make(**kwargs):
    kwargs.setdefault("engine", make_tiny_engine())
    kwargs.setdefault("split", "all")
    return gym.make("progpo/WebShop-v0", **kwargs)


def play_expert(env, task_index):
    obs, info = env.reset(options={"task_index": task_index})
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(info["expert_action"])
        total += reward
        steps += 1
        if terminated or truncated:
            return total, info, steps


@pytest.mark.parametrize("kwargs", [{}, {"expert": True, "history_depths": (1, 3)}])
def test_text_env_contract(kwargs):
    env = make(**kwargs)
    check_text_env(env.unwrapped)
    assert env.unwrapped.metadata["prompt_style"] == "webshop"
    assert WebShopEnv.split_names() == ("test", "train", "all")
    env.close()
    env.close()


def test_reset_observation_and_info():
    env = make()
    obs, info = env.reset(options={"task_index": 1})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] find organic green tea")
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["admissible_actions"] == ["search[<query>]"]
    assert info["goal_index"] == 1 and info["task_score"] == 0.0 and info["won"] is False
    assert isinstance(info["obs_hash"], np.uint64) and isinstance(info["history_key"], np.uint64)
    assert env.unwrapped.num_tasks == 4


def test_same_seed_same_episode():
    def run(seed):
        env = make()
        obs, info = env.reset(seed=seed)
        trace = [(obs, int(info["history_key"]), info["goal_index"])]
        for action in ["search[socks]", "click[b0sock0001]", "click[features]", "bogus", "click[< prev]"]:
            obs, reward, term, trunc, info = env.step(action)
            trace.append((obs, reward, term, trunc, int(info["history_key"]), info["action_valid"]))
        return trace

    assert run(7) == run(7)
    goals = {make().reset(seed=s)[1]["goal_index"] for s in range(20)}
    assert len(goals) > 1  # the seed picks the task


def test_success_reward_is_ten_and_raw_mode_gives_the_score():
    env = make(expert=True)
    total, info, _ = play_expert(env, 0)
    assert total == SUCCESS_REWARD and info["won"] and info["task_score"] == 1.0
    env = make(reward_mode="raw")
    env.reset(options={"task_index": 0})
    for action in ["search[socks]", "click[b0sock0001]", "click[black]", "click[buy now]"]:
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and 0 < reward < 1 and reward == info["task_score"] and not info["won"]


def test_wrong_option_gets_no_success_reward():
    env = make()
    env.reset(options={"task_index": 0})
    for action in ["search[socks]", "click[b0sock0001]", "click[navy]", "click[small]", "click[buy now]"]:
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 0.0 and 0 < info["task_score"] < 1.0


def test_invalid_actions_are_no_ops_and_max_steps_truncates():
    env = make()
    obs0, _ = env.reset(options={"task_index": 0})
    for i, action in enumerate(["click[buy now]", "", "x" * 10_000, 42, "\x07", "search[]"] * 3):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == obs0 and reward == 0.0 and not terminated and info["action_valid"] is False
        if i + 1 == DEFAULT_MAX_STEPS:
            assert truncated
            break
        assert not truncated


def test_expert_action_only_with_expert_flag_and_never_in_observation():
    env = make()
    _, info = env.reset(options={"task_index": 0})
    assert "expert_action" not in info
    env = make(expert=True)
    obs, info = env.reset(options={"task_index": 0})
    assert info["expert_action"].startswith("search[")
    _, _, _, _, info = env.step(info["expert_action"])
    assert info["expert_action"] == "click[b0sock0001]"


def test_splits_select_goal_ranges():
    env = make(split="test")
    assert env.unwrapped.num_tasks == 2 and env.reset(options={"task_index": 1})[1]["goal_index"] == 1
    env = make(split="train")
    assert env.unwrapped.num_tasks == 2 and env.reset(options={"task_index": 0})[1]["goal_index"] == 2
    with pytest.raises(ValueError):
        env.reset(options={"task_index": 2})


@pytest.mark.parametrize("mode", ["text", "text_rich", "html", "url"])
def test_observation_modes(mode):
    env = make(observation_mode=mode)
    obs, _ = env.reset(options={"task_index": 0})
    obs, *_ = env.step("search[socks]")
    expected = {
        "text": "Page 1 (Total results:",
        "text_rich": "[button] Back to Search [button_]",
        "html": '<a class="product-link"',
        "url": "/search_results/fixed_0?q=socks&page=1",
    }[mode]
    assert expected in obs


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_group_vector_env(vector_mode):
    envs = gym.make_vec(
        "progpo/WebShop-v0",
        num_envs=4,
        group_size=2,
        vector_mode=vector_mode,
        num_workers=2,
        engine=make_tiny_engine(),
        split="all",
        expert=True,
    )
    try:
        obs, info = envs.reset(seed=3, options={"task_indices": [0, 2]})
        assert info["goal_index"].tolist() == [0, 0, 2, 2] and info["group_id"].tolist() == [0, 0, 1, 1]
        assert obs[0] == obs[1] and obs[0] != obs[2]
        won = np.zeros(4, dtype=bool)
        for _ in range(DEFAULT_MAX_STEPS):
            actions = [a if a is not None else "noop" for a in info["expert_action"]]
            obs, rewards, terminated, truncated, info = envs.step(actions)
            won |= info["won"]
            if (terminated | truncated).all():
                break
        assert won.all() and terminated.all()
    finally:
        envs.close()
