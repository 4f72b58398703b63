"""A full episode in headless Chromium against the production server, scored like the in-process env."""

from __future__ import annotations

import pytest

from progpo_envs.webshop.browser import WebShopBrowserEnv, chromium_available
from progpo_envs.webshop.env import WebShopEnv
from webshop_server.engine import WebShopEngine

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not chromium_available(), reason="needs apt packages chromium chromium-driver"),
]


def test_browser_episode_equals_in_process_episode(waitress_server, tmp_path):
    url, num_products = waitress_server
    local = WebShopEnv(
        engine=WebShopEngine.shared(num_products, 0, cache_dir=tmp_path), split="test", reward_mode="raw"
    )
    browser = WebShopBrowserEnv(url=url, split="test", expert=True, reward_mode="raw")
    try:
        for task_index, detour in ((0, ["click[features]", "click[< prev]"]), (1, [])):
            obs_b, info_b = browser.reset(options={"task_index": task_index})
            obs_l, info_l = local.reset(options={"task_index": task_index})
            assert obs_b == obs_l and info_b["available_actions"] == info_l["available_actions"]
            actions = []
            while True:
                action = info_b["expert_action"]
                if action.startswith("click[b0") and detour:  # visit a sub-page of the item on the way
                    actions += [action] + detour
                    for extra in [action] + detour:
                        obs_b, r_b, term_b, trunc_b, info_b = browser.step(extra)
                        obs_l, r_l, term_l, trunc_l, info_l = local.step(extra)
                        assert obs_b == obs_l and info_b["available_actions"] == info_l["available_actions"]
                    detour = []
                    continue
                actions.append(action)
                obs_b, r_b, term_b, trunc_b, info_b = browser.step(action)
                obs_l, r_l, term_l, trunc_l, info_l = local.step(action)
                assert obs_b == obs_l, action
                assert info_b["available_actions"] == info_l["available_actions"]
                if term_b or trunc_b:
                    break
            assert term_b and term_l and r_b == r_l == 1.0 and info_b["task_score"] == info_l["task_score"]
        # a wrong option scores the same in both, below 1
        browser.reset(options={"task_index": 2})
        local.reset(options={"task_index": 2})
        obs, _, _, _, info = browser.step(browser.unwrapped._api.expert_action(browser._sid))
        local.step(local.unwrapped._backend.expert_action(local._sid))
        product = info["available_actions"]["clickables"]
        asin = next(c for c in product if c.startswith("b0"))
        for action in [f"click[{asin}]", "click[buy now]"]:
            _, r_b, term_b, _, info_b = browser.step(action)
            _, r_l, term_l, _, info_l = local.step(action)
        assert term_b and term_l and r_b == r_l and info_b["task_score"] == info_l["task_score"]
    finally:
        browser.close()
        local.close()
