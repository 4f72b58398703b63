"""``progpo/Remote-v0``'s vector env plugs in its batched requests as a backend of the group vector env, and
so serves the per-group calls (``reset_group``, ``step_some``) too, one request per server each."""

from __future__ import annotations

import gymnasium as gym
import requests

from progpo_envs.core.worker_protocol import VectorBackend
from progpo_envs.server.remote import REMOTE_ENV_ID, RemoteEnv
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, same


def _requests(url: str) -> int:
    return requests.get(f"{url}/metrics", timeout=10).json()["http"]["requests"]


def test_a_group_of_remote_copies_resets_and_steps_alone_like_in_process_copies(toy_url):
    local = gym.make_vec(TOY_ENV_ID, num_envs=4, group_size=2)
    remote = gym.make_vec(REMOTE_ENV_ID, num_envs=4, group_size=2, url=toy_url, env_id=TOY_ENV_ID)
    try:
        assert isinstance(remote.backend, VectorBackend)
        assert all(isinstance(env, RemoteEnv) for env in remote.backend.envs)
        for envs in (local, remote):
            envs.reset(seed=1, options={"task_indices": [0, 2]})
        before = _requests(toy_url)
        remote_trace = [
            remote.reset_group(1, seed=9, options={"task_index": 5}),
            remote.step_some([3, 2], ["take key", "look"]),
            remote.step_some([0], ["go left"]),
        ]
        assert _requests(toy_url) - before - 1 == 3  # one batch request each (the metrics read aside)
        local_trace = [
            local.reset_group(1, seed=9, options={"task_index": 5}),
            local.step_some([3, 2], ["take key", "look"]),
            local.step_some([0], ["go left"]),
        ]
        assert same(remote_trace, local_trace)
    finally:
        remote.close()
        local.close()
