"""``progpo/Remote-v0`` behaves like the in-process env: same observations, rewards, flags, infos, hashes."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
import requests

from progpo_envs.server.remote import (
    REMOTE_ENV_ID,
    InstanceLostError,
    RemoteEnv,
    RemoteEnvError,
    RemoteGroupVectorEnv,
    ServerUnavailableError,
    step_batch,
)
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, plain, same

ACTIONS = [
    "go left",
    "go right",
    "take key",
    "open door",
    "look",
    "dance",
    "",
    "x" * 5000,
    "bad\x00action",
    17,
    None,
]


def play(env: gym.Env, seed: int, steps: int, rng: random.Random, options=None) -> list:
    trace = [env.reset(seed=seed, options=options)]
    for _ in range(steps):
        trace.append(env.step(rng.choice(ACTIONS)))
    return trace


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_remote_matches_in_process(toy_url, seed):
    kwargs = {"rooms": 4, "max_steps": 12, "history_depths": (1, 2)}
    local = gym.make(TOY_ENV_ID, **kwargs)
    remote = gym.make(REMOTE_ENV_ID, url=toy_url, env_id=TOY_ENV_ID, **kwargs)
    for episode in range(3):  # later resets without a seed continue each env's own RNG
        episode_seed = seed if episode == 0 else None
        local_trace = play(local, episode_seed, 14, random.Random(seed + episode))
        remote_trace = play(remote, episode_seed, 14, random.Random(seed + episode))
        assert same(remote_trace, local_trace)
    assert remote.unwrapped.num_tasks == local.unwrapped.num_tasks
    assert type(remote_trace[-1][-1]["history_key"]) is np.uint64
    remote.close()
    remote.close()  # twice is fine


def _rollout(envs, seed: int, steps: int) -> list:
    rng = random.Random(seed)
    trace = [envs.reset(seed=seed, options={"task_indices": [1, 4]})]
    for _ in range(steps):
        trace.append(envs.step([rng.choice(ACTIONS[:6]) for _ in range(envs.num_envs)]))
    return trace


def test_group_vector_env_over_remote_batches_requests(toy_url):
    local = gym.make_vec(TOY_ENV_ID, num_envs=4, group_size=2)
    remote = gym.make_vec(REMOTE_ENV_ID, num_envs=4, group_size=2, url=toy_url, env_id=TOY_ENV_ID)
    assert isinstance(remote, RemoteGroupVectorEnv)
    before = requests.get(f"{toy_url}/metrics", timeout=10).json()["http"]["requests"]
    remote_trace = _rollout(remote, seed=3, steps=10)
    requests_made = requests.get(f"{toy_url}/metrics", timeout=10).json()["http"]["requests"] - before - 1
    assert requests_made == 11  # one batch request per vector reset/step, not one per copy
    local_trace = _rollout(local, seed=3, steps=10)
    assert plain(remote_trace) == plain(local_trace)
    obs, info = remote_trace[0]
    assert info["group_id"].tolist() == [0, 0, 1, 1] and obs[0] == obs[1] and info["task_id"][2] == "toy-4"
    assert remote.call("num_tasks") == (16, 16, 16, 16)
    remote.close()
    local.close()


def test_group_vector_env_over_remote_async(toy_url):
    remote = gym.make_vec(
        REMOTE_ENV_ID,
        num_envs=4,
        group_size=2,
        url=toy_url,
        env_id=TOY_ENV_ID,
        vector_mode="async",
        num_workers=2,
    )
    local = gym.make_vec(TOY_ENV_ID, num_envs=4, group_size=2)
    assert plain(_rollout(remote, seed=8, steps=6)) == plain(_rollout(local, seed=8, steps=6))
    remote.close()
    local.close()


def test_step_batch_equals_single_steps(toy_url):
    batch_envs = [RemoteEnv(toy_url, TOY_ENV_ID) for _ in range(3)]
    single_envs = [RemoteEnv(toy_url, TOY_ENV_ID) for _ in range(3)]
    for i, (a, b) in enumerate(zip(batch_envs, single_envs, strict=False)):
        assert same(a.reset(seed=i), b.reset(seed=i))
    for actions in (["look", "go right", "take key"], ["go right", "dance", 3]):
        batched = step_batch(batch_envs, actions)
        singles = [env.step(action) for env, action in zip(single_envs, actions, strict=False)]
        assert same(batched, singles)
    batch_envs[1].close()
    with pytest.raises(ValueError):
        step_batch(batch_envs, ["look"])


def test_reset_needed_and_lost_instances(toy_url):
    env = RemoteEnv(toy_url, TOY_ENV_ID)
    with pytest.raises(gym.error.ResetNeeded):
        env.step("look")
    env.reset(seed=0)
    env._client.request("DELETE", env._path())  # closed behind the env's back (like an expiry)
    with pytest.raises(InstanceLostError):
        env.step("look")


def test_rejected_kwargs_are_clear_errors(toy_url):
    with pytest.raises(RemoteEnvError, match="not allowed"):
        RemoteEnv(toy_url, TOY_ENV_ID, data_dir="/etc")
    with pytest.raises(ValueError):
        RemoteEnv(toy_url, REMOTE_ENV_ID)


def test_server_gone_is_a_clear_error():
    with pytest.raises(ServerUnavailableError, match="unavailable"):
        RemoteEnv("http://127.0.0.1:9", TOY_ENV_ID, retries=1, backoff=0.01, connect_timeout=0.5)


def test_server_process_killed_mid_episode():
    from tests.progpo_envs.server.hosting_helpers import CliServer

    server = CliServer("--import", "progpo_envs.testing", "--env", TOY_ENV_ID)
    env = RemoteEnv(server.url, TOY_ENV_ID, retries=2, backoff=0.01, connect_timeout=0.5, timeout=5)
    env.reset(seed=0)
    env.step("look")
    server.process.kill()
    server.process.wait(10)
    with pytest.raises(ServerUnavailableError, match=server.url):
        env.step("look")
    env.close()  # quiet when the server is gone


@pytest.mark.parametrize("what", ["body", "headers"])
def test_timeout_is_a_deadline_against_a_trickling_server(trickling_server, what):
    """A server that answers a byte at a time resets any per-read timeout; ``timeout=`` bounds the whole call
    (before: reset() was still blocked after 60 s with timeout=5)."""
    import time

    server = trickling_server(["/reset"], what=what, reply={"instance_id": "i", "num_tasks": 1})
    env = gym.make(REMOTE_ENV_ID, url=server.url, env_id=TOY_ENV_ID, timeout=1.5, backoff=0.01)
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match=r"within timeout=1\.5 s"):
        env.reset(seed=0)
    assert time.monotonic() - started < 4.0
    env.close()
