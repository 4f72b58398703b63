"""The real envs through the server: remote == in-process, and AgentGym's protocol for ALFWorld and WebShop.

Skipped when an env cannot be built here (its engine or data missing).
"""

from __future__ import annotations

import random

import gymnasium as gym
import pytest
import requests

from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.remote import RemoteEnv, step_batch
from progpo_envs.server.serving import BackgroundServer
from tests.progpo_envs.server.hosting_helpers import concurrent_clients, same

ALFWORLD = "progpo/ALFWorld-v0"
WEBSHOP = "progpo/WebShop-v0"
#: Small, fast settings of each env (fixed by the operator on the server, passed in-process).
ENV_KWARGS = {ALFWORLD: {"split": "train"}, WEBSHOP: {"num_products": 200, "split": "test"}}


def _server_for(env_id: str):
    try:
        gym.make(env_id, **ENV_KWARGS[env_id]).close()
    except Exception as exc:  # noqa: BLE001 - any failure to build means "not available here"
        pytest.skip(f"{env_id} cannot be built here: {exc!r}")
    app = create_app(
        ServerConfig(
            env_ids=(env_id,),
            env_kwargs={env_id: ENV_KWARGS[env_id]},
            pool=PoolConfig(num_workers=1),
            agentgym=env_id,
        )
    )
    return BackgroundServer(app).__enter__()


@pytest.fixture(scope="module")
def alfworld_url():
    server = _server_for(ALFWORLD)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def webshop_url():
    server = _server_for(WEBSHOP)
    yield server.url
    server.stop()


def _compare(env_id: str, url: str, seed: int, steps: int, history_depths=(1, 2)) -> None:
    local = gym.make(env_id, **ENV_KWARGS[env_id], history_depths=history_depths)
    remote = gym.make(REMOTE_ENV_ID, url=url, env_id=env_id, history_depths=history_depths)
    rng = random.Random(seed)
    local_trace, remote_trace = [local.reset(seed=seed)], [remote.reset(seed=seed)]
    assert same(remote_trace[0], local_trace[0])
    for _ in range(steps):
        actions = local_trace[-1][-1]["admissible_actions"] + ["nonsense action", "", 5]
        action = rng.choice(actions)
        if isinstance(action, str) and action.startswith("search["):
            action = "search[cotton shirt]"
        local_trace.append(local.step(action))
        remote_trace.append(remote.step(action))
        assert same(remote_trace[-1], local_trace[-1])
        if local_trace[-1][2] or local_trace[-1][3]:
            break
    remote.close()
    local.close()


@pytest.mark.parametrize("seed", [0, 11])
def test_alfworld_remote_equals_in_process(alfworld_url, seed):
    _compare(ALFWORLD, alfworld_url, seed, steps=12)


@pytest.mark.parametrize("seed", [0, 5])
def test_webshop_remote_equals_in_process(webshop_url, seed):
    _compare(WEBSHOP, webshop_url, seed, steps=8)


def test_webshop_batch_step(webshop_url):
    envs = [RemoteEnv(webshop_url, WEBSHOP) for _ in range(3)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    results = step_batch(envs, ["search[blue socks]"] * 3)
    assert all(isinstance(obs, str) and info["action_valid"] for obs, _, _, _, info in results)


def test_alfworld_agentgym_protocol(alfworld_url):
    env_id = requests.post(f"{alfworld_url}/create", timeout=60).json()["id"]
    reset = requests.post(
        f"{alfworld_url}/reset", json={"id": env_id, "game": 0, "world_type": "Text"}, timeout=60
    ).json()
    local = gym.make(ALFWORLD, **ENV_KWARGS[ALFWORLD])
    obs, info = local.reset(options={"task_index": 0})
    # AgentGym's forms (test_hosting_agentgym.py): no banner, task_type "<task folder>/<trial>"
    assert reset["observation"] == "\n".join(obs.split("\n\n")[1:])
    assert reset["available_actions"] == info["admissible_actions"] and reset["task_type"] == info["task_id"]
    action = info["admissible_actions"][0]
    step = requests.post(f"{alfworld_url}/step", json={"id": env_id, "action": action}, timeout=60).json()
    local_obs, reward, terminated, truncated, local_info = local.step(action)
    assert step == {
        "observation": local_obs,
        "reward": reward,
        "available_actions": local_info["admissible_actions"],
        "done": terminated or truncated,
    }
    local.close()


def test_webshop_agentgym_protocol(webshop_url):
    env_idx = requests.post(f"{webshop_url}/create", timeout=60).json()
    assert isinstance(env_idx, int)
    reset = requests.post(
        f"{webshop_url}/reset", json={"env_idx": env_idx, "session_id": 3}, timeout=60
    ).json()
    local = gym.make(WEBSHOP, **ENV_KWARGS[WEBSHOP])
    obs, info = local.reset(options={"task_index": 3})
    assert reset == [obs, None]
    assert requests.get(f"{webshop_url}/observation", params={"env_idx": env_idx}, timeout=60).json() == obs
    actions = requests.get(f"{webshop_url}/available_actions", params={"env_idx": env_idx}, timeout=60).json()
    assert actions == {"has_search_bar": True, "clickables": list(info["available_actions"]["clickables"])}
    instruction = requests.get(
        f"{webshop_url}/instruction_text", params={"env_idx": env_idx}, timeout=60
    ).json()
    assert instruction and instruction in obs
    state = requests.get(f"{webshop_url}/state", params={"env_idx": env_idx}, timeout=60).json()
    assert state["instruction_text"] == instruction
    step = requests.post(
        f"{webshop_url}/step", json={"env_idx": env_idx, "action": "search[socks]"}, timeout=60
    ).json()
    local_obs, reward, terminated, truncated, _ = local.step("search[socks]")
    assert step == {"state": local_obs, "reward": reward, "done": terminated or truncated, "info": None}
    local.close()


def _concurrent_episodes(url: str, env_id: str, clients: int, steps: int) -> list[str]:
    """``clients`` threads stepping their own remote env with admissible actions; returns the errors."""

    def play(index: int) -> None:
        rng = random.Random(index)
        env = RemoteEnv(url, env_id)
        info = env.reset(seed=index)[1]
        for _ in range(steps):
            action = rng.choice(info["admissible_actions"])
            action = "search[cotton shirt]" if action.startswith("search[") else action
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                info = env.reset()[1]
        env.close()

    return concurrent_clients(play, clients, timeout=1800)


@pytest.mark.slow
def test_webshop_32_clients_200_steps(webshop_url):
    assert _concurrent_episodes(webshop_url, WEBSHOP, clients=32, steps=200) == []


@pytest.mark.slow
def test_alfworld_32_clients(alfworld_url):
    # 32 x 60 steps: ALFWorld steps and game loads are ~100x slower than WebShop's (see bench_hosting)
    assert _concurrent_episodes(alfworld_url, ALFWORLD, clients=32, steps=60) == []
