"""The verl-agent env manager over several env servers: a lost server ends its trajectories (``done``, not an
exception), and ``success_evaluator`` reports the share it ended and each server's share."""

from __future__ import annotations

import gymnasium as gym

from agents.base import PromptConfig
from agents.envs import prompt_style
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_verl.verl_agent.envs import ProGPOEnvManager
from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, serve_toy


def test_a_lost_server_ends_its_trajectories_and_the_metrics_show_it():
    servers = [serve_toy(num_workers=1) for _ in range(2)]
    try:
        envs = gym.make_vec(
            REMOTE_ENV_ID,
            num_envs=4,
            group_size=2,
            url=[s.url for s in servers],
            env_id=TOY_ENV_ID,
            retries=1,
            backoff=0.05,
        )
        manager = ProGPOEnvManager(envs, prompt_style(envs), PromptConfig(require_think=False), seed=0)
        manager.reset()
        answer = "<action>look</action>"
        infos_per_step = [manager.step([answer] * 4)[3]]
        servers[1].stop()  # the second group's server
        _, rewards, dones, infos = manager.step([answer] * 4)
        infos_per_step.append(infos)
        assert dones.tolist() == [False, False, True, True] and rewards[2:].tolist() == [0.0, 0.0]
        assert all("env_error" in info for info in infos[2:])
        rows = [[{"active_masks": True}, {"active_masks": True}] for _ in range(4)]
        trajectories = [[step[i] for step in infos_per_step] for i in range(4)]
        metrics = manager.success_evaluator(total_infos=trajectories, total_batch_list=rows)
        assert metrics["env_failed_rate"].tolist() == [0.0, 0.0, 1.0, 1.0]
        assert metrics["server/1/failed_episodes"].tolist() == [2.0] and metrics["server/1/up"].tolist() == [
            0.0
        ]
        manager.close()
    finally:
        servers[0].stop()
