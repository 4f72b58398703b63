"""The expert on the real stack (generated catalog, tantivy index, real reward): 1.0 on each of 200 goals."""

from __future__ import annotations

import numpy as np

from progpo_envs.webshop.env import SUCCESS_REWARD, WebShopEnv
from webshop_server.expert import expert_action, target_options
from webshop_server.reward import get_reward


def test_expert_scores_one_on_200_test_goals(generated_engine):
    env = WebShopEnv(engine=generated_engine, split="test", expert=True)
    assert env.num_tasks >= 200
    for task_index in range(200):
        obs, info = env.reset(options={"task_index": task_index})
        goal = generated_engine.goal(info["goal_index"])
        assert goal["asin"] not in obs and goal["asin"].lower() not in str(info["available_actions"])
        while True:
            obs, reward, terminated, truncated, info = env.step(info["expert_action"])
            if terminated or truncated:
                break
        assert terminated and info["task_score"] == 1.0 and reward == SUCCESS_REWARD, (task_index, obs)


def test_wrong_option_scores_lower_and_random_product_much_lower(generated_engine):
    rng = np.random.default_rng(0)
    products = generated_engine.catalog.products
    checked = 0
    for goal_index in range(100):
        goal = generated_engine.goal(goal_index)
        product = generated_engine.product(goal["asin"])
        price = generated_engine.catalog.product_prices[goal["asin"]]
        right = target_options(product, goal)
        axes = [name for name in right if len(product["options"][name]) > 1]
        if not axes:
            continue
        name = axes[0]
        wrong = dict(right, **{name: next(v for v in product["options"][name] if v != right[name])})
        full = get_reward(product, goal, price=price, options=right)
        partial = get_reward(product, goal, price=price, options=wrong, verbose=True)
        other = products[int(rng.integers(len(products)))]
        random = get_reward(
            other, goal, price=generated_engine.catalog.product_prices[other["asin"]], options={}
        )
        assert full == 1.0 and partial["reward"] < 1.0 and partial["r_option"] < 1.0
        assert random < partial["reward"] or other["asin"] == goal["asin"]
        checked += 1
    assert checked >= 50


def test_expert_recovers_from_detours(generated_engine):
    session = generated_engine.new_session(3)
    for action in ["search[zzz unrelated words]", "click[back to search]", "search[shoes]"]:
        generated_engine.step(session, action)
    for _ in range(15):
        action = expert_action(generated_engine, session)
        if action is None:
            break
        assert generated_engine.step(session, action).valid, action
    assert session.score == 1.0
