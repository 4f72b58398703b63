"""Stand-in for verl-agent's ``rollout_loop.TrajectoryCollector`` and ``utils.adjust_batch``.

As verl-agent's: the ``B`` prompts of the gen batch are repeated ``env.rollout.n`` times; one ``uid`` per
group of ``n`` envs, one ``traj_uid`` per env; every env gets a response each step (ended ones too); the env
manager's ``anchor`` becomes ``anchor_obs``; only active rows are kept, gathered trajectory after trajectory
in step order, with ``episode_rewards`` and the success rates (batch means) on each row.
"""

import uuid

import numpy as np
import torch

from tests.progpo_verl.verl_batches import Batch


class TrajectoryCollector:
    def __init__(self, config, tokenizer, processor=None):
        self.config = config
        self.tokenizer = tokenizer
        self.processor = processor

    def multi_turn_loop(self, gen_batch, actor_rollout_wg, envs, is_train: bool = True):
        n = self.config["env"]["rollout"]["n"] if is_train else 1
        batch_size = len(gen_batch) * n
        obs, infos = envs.reset(kwargs=None)
        assert len(obs["text"]) == batch_size, (len(obs["text"]), batch_size)
        uid_batch = []
        for i in range(batch_size):
            if i % n == 0:
                uid = str(uuid.uuid4())
            uid_batch.append(uid)
        traj_uid = [str(uuid.uuid4()) for _ in range(batch_size)]
        is_done = np.zeros(batch_size, dtype=bool)
        rows = [[] for _ in range(batch_size)]
        total_infos = [[] for _ in range(batch_size)]
        episode_rewards = np.zeros(batch_size, dtype=np.float32)
        episode_lengths = np.zeros(batch_size, dtype=np.float32)
        for step in range(self.config["env"]["max_steps"]):
            active = ~is_done
            responses = self.tokenizer.encode(actor_rollout_wg(obs["text"]))
            text_actions = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
            next_obs, rewards, dones, infos = envs.step(text_actions)
            episode_rewards[active] += np.asarray(rewards, dtype=np.float32)[active]
            episode_lengths[active] += 1
            for i in range(batch_size):
                rows[i].append(
                    {
                        "uid": uid_batch[i],
                        "traj_uid": traj_uid[i],
                        "anchor_obs": obs["anchor"][i],
                        "rewards": rewards[i],
                        "is_action_valid": np.bool_(infos[i]["is_action_valid"]),
                        "active_masks": bool(active[i]),
                        "responses": responses[i],
                        "standin_step": step,  # not verl-agent's: the tests' ground truth of each row's step
                    }
                )
                total_infos[i].append(infos[i])
            is_done = np.logical_or(is_done, dones)
            obs = next_obs
            if is_done.all():
                break
        success = envs.success_evaluator(
            total_infos=total_infos,
            total_batch_list=rows,
            episode_rewards=episode_rewards,
            episode_lengths=episode_lengths,
        )
        kept = []
        for i in range(batch_size):
            for row in rows[i]:
                if row["active_masks"]:
                    row = dict(row, episode_rewards=episode_rewards[i], episode_lengths=episode_lengths[i])
                    row.update({key: np.mean(value) for key, value in success.items()})
                    kept.append(row)
        responses = torch.stack([row.pop("responses") for row in kept])
        mask = (responses != 0).long()
        tensors = {
            "responses": responses,
            "attention_mask": torch.cat([torch.ones_like(mask), mask], dim=1),
            "input_ids": torch.cat([torch.ones_like(responses), responses], dim=1),
        }
        non_tensor = {key: np.array([row[key] for row in kept], dtype=object) for key in kept[0]}
        return Batch(tensors, non_tensor)


def adjust_batch(config, data, mode="copy"):
    """Copies of random rows appended until the batch divides by ``config["trainer"]["size_divisor"]``."""
    divisor = config["trainer"]["size_divisor"]
    remainder = len(data) % divisor
    if remainder == 0:
        return data
    rng = np.random.default_rng(config["trainer"]["seed"])
    return data.concat(data.select(rng.choice(len(data), divisor - remainder, replace=False)))
