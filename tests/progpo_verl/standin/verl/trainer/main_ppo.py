"""Stand-in for verl-agent's ``verl/trainer/main_ppo.py``: ``run_ppo(config)`` builds the trainer and fits."""

from agent_system.multi_turn_rollout import TrajectoryCollector

from verl.trainer.ppo.ray_trainer import RayPPOTrainer

RUNS = []


def run_ppo(config) -> None:
    from agent_system.environments import make_envs  # imported at call time, as verl-agent's TaskRunner does

    envs, val_envs = make_envs(config)
    tokenizer = config["_standin"]["tokenizer"]
    trainer = RayPPOTrainer(
        config,
        tokenizer,
        role_worker_mapping={},
        resource_pool_manager=None,
        traj_collector=TrajectoryCollector(config, tokenizer),
        envs=envs,
        val_envs=val_envs,
    )
    trainer.fit()
    RUNS.append(trainer)
