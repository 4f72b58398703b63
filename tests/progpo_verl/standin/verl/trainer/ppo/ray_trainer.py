"""Stand-in for verl-agent's ``verl/trainer/ppo/ray_trainer.py``: the estimator enum, ``compute_advantage``
(a closed if/elif ending in ``NotImplementedError``), ``RayPPOTrainer.__init__``'s closed list of critic-free
estimators and a ``fit`` that runs the steps between the rollout loop and ``compute_advantage``."""

from enum import Enum

import numpy as np
import torch
from agent_system.multi_turn_rollout import TrajectoryCollector, adjust_batch


class AdvantageEstimator(str, Enum):
    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    GRPO_PASSK = "grpo_passk"
    GiGPO = "gigpo"


def compute_response_mask(data):
    responses = data.batch["responses"]
    return data.batch["attention_mask"][:, -responses.size(1) :]


def compute_advantage(
    data,
    adv_estimator,
    gamma=1.0,
    lam=1.0,
    num_repeat=1,
    multi_turn=False,
    norm_adv_by_std_in_grpo=True,
    step_advantage_w=1.0,
    gigpo_mode="mean_std_norm",
    gigpo_enable_similarity=False,
    gigpo_similarity_thresh=0.95,
    **kwargs,
):
    if "response_mask" not in data.batch:
        data.batch["response_mask"] = compute_response_mask(data)
    if adv_estimator == AdvantageEstimator.GRPO:  # mean-centred episode reward per uid (enough to tell apart)
        scores = data.non_tensor_batch["episode_rewards"].astype(np.float32)
        uids = data.non_tensor_batch["uid"]
        centred = np.array(
            [s - scores[uids == u].mean() for s, u in zip(scores, uids, strict=True)], dtype=np.float32
        )
        data.batch["advantages"] = torch.tensor(centred)[:, None] * data.batch["response_mask"]
    elif adv_estimator in list(AdvantageEstimator):
        data.batch["advantages"] = torch.zeros_like(data.batch["response_mask"], dtype=torch.float32)
    else:
        raise NotImplementedError
    data.batch["returns"] = data.batch["advantages"]
    return data


class RayPPOTrainer:
    def __init__(
        self,
        config,
        tokenizer,
        role_worker_mapping,
        resource_pool_manager,
        ray_worker_group_cls=None,
        processor=None,
        reward_fn=None,
        val_reward_fn=None,
        train_dataset=None,
        val_dataset=None,
        collate_fn=None,
        train_sampler=None,
        device_name="cuda",
        traj_collector: TrajectoryCollector = None,
        envs=None,
        val_envs=None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.traj_collector = traj_collector
        self.envs = envs
        self.val_envs = val_envs
        self.batches = []
        if self.config["algorithm"]["adv_estimator"] == AdvantageEstimator.GAE:
            self.use_critic = True
        elif self.config["algorithm"]["adv_estimator"] in [
            AdvantageEstimator.GRPO,
            AdvantageEstimator.GRPO_PASSK,
            AdvantageEstimator.REINFORCE_PLUS_PLUS,
            AdvantageEstimator.REMAX,
            AdvantageEstimator.RLOO,
            AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
            AdvantageEstimator.GiGPO,
        ]:
            self.use_critic = False
        else:
            raise NotImplementedError
        self.estimator_at_init = self.config["algorithm"]["adv_estimator"]

    def fit(self):
        standin = self.config["_standin"]
        for step in range(self.config["trainer"]["total_training_steps"]):
            gen_batch = standin["gen_batch"]
            batch = self.traj_collector.multi_turn_loop(
                gen_batch=gen_batch, actor_rollout_wg=standin["actor"], envs=self.envs, is_train=True
            )
            batch = adjust_batch(self.config, batch)
            batch.batch["response_mask"] = compute_response_mask(batch)
            if self.config["trainer"]["balance_batch"]:  # _balance_batch: breaks the order of the rows
                order = np.random.default_rng(step).permutation(len(batch))
                batch = batch.select(order)
            batch = compute_advantage(
                batch,
                adv_estimator=self.config["algorithm"]["adv_estimator"],
                gamma=self.config["algorithm"]["gamma"],
                lam=1.0,
                num_repeat=self.config["env"]["rollout"]["n"],
                norm_adv_by_std_in_grpo=True,
                multi_turn=False,
                use_pf_ppo=False,
                step_advantage_w=1.0,
                gigpo_mode="mean_std_norm",
                gigpo_enable_similarity=False,
                gigpo_similarity_thresh=0.95,
            )
            self.batches.append(batch)
