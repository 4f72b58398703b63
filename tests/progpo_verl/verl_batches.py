"""DataProto-shaped batches as verl-agent's rollout loop makes them, with the ground truth of every row.

verl-agent (read at 20bd331, ``agent_system/multi_turn_rollout/rollout_loop.py``) plays ``B × n`` envs in
lock-step and returns one row per active (env, step), trajectory after trajectory, steps in order; every
non-tensor column is a numpy object array (``collate_fn``); ``responses``/``attention_mask`` are torch
tensors.
``adjust_batch(mode="copy")`` appends copies of random rows, and ``_balance_batch`` permutes the rows.

:func:`rollout_batch` makes such a batch from a seeded random episode generator and keeps, beside it, what
each row is (group, trajectory, step, reward, ...), so a test can build the estimator rows independently of
the adapter.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

import numpy as np
import torch

from progpo_verl.rows import ACTION_COLUMN, STEP_COLUMN, step_tags

ANCHORS = [
    "You are in the middle of a room.",
    "You arrive at desk 1.",
    "Nothing happens.",
    "The drawer is open.",
]
ACTIONS = ["go to desk 1", "open drawer 1", "take mug 1 from desk 1", "look", "inventory"]


@dataclasses.dataclass
class Batch:
    """A DataProto stand-in: ``batch`` (name -> torch tensor ``[N, ...]``) and ``non_tensor_batch``."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.non_tensor_batch["uid"])

    def select(self, rows: np.ndarray) -> Batch:
        index = torch.as_tensor(rows, dtype=torch.long)
        return Batch(
            {k: v[index] for k, v in self.batch.items()},
            {k: v[rows] for k, v in self.non_tensor_batch.items()},
            dict(self.meta_info),
        )

    def concat(self, other: Batch) -> Batch:
        return Batch(
            {k: torch.cat([v, other.batch[k]]) for k, v in self.batch.items()},
            {k: np.concatenate([v, other.non_tensor_batch[k]]) for k, v in self.non_tensor_batch.items()},
            dict(self.meta_info),
        )


def _uuid(rng: np.random.Generator) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16)))


def rollout_batch(
    seed: int, groups: int = 4, group_size: int = 4, max_steps: int = 6, response_length: int = 7
) -> tuple[Batch, dict[str, np.ndarray]]:
    """A batch in the rollout loop's row order, and the truth of its rows (``[N]`` arrays: ``group``,
    ``traj``, ``step``, ``reward``, ``valid``, ``obs``, ``action``, ``episode_reward``, ``won``)."""
    rng = np.random.default_rng(seed)
    truth = {k: [] for k in ("group", "traj", "step", "reward", "valid", "obs", "action", "episode_reward")}
    columns = {k: [] for k in ("uid", "traj_uid", "rewards", "is_action_valid", "anchor_obs", "active_masks")}
    columns["episode_rewards"] = []
    lengths = []
    for g in range(groups):
        uid = _uuid(rng)
        for copy in range(group_size):
            traj = g * group_size + copy
            traj_uid = _uuid(rng)
            length = int(rng.integers(1, max_steps + 1))
            won = bool(rng.random() < 0.4)
            rewards = np.zeros(length)
            if won:
                rewards[-1] = 10.0
            for t in range(length):
                obs = ANCHORS[int(rng.integers(len(ANCHORS)))] if t else ANCHORS[0]
                valid = bool(rng.random() < 0.8)
                action = ACTIONS[int(rng.integers(len(ACTIONS)))]
                for key, value in zip(
                    ("group", "traj", "step", "reward", "valid", "obs", "action", "episode_reward"),
                    (g, traj, t, rewards[t], valid, obs, action, rewards.sum()),
                    strict=True,
                ):
                    truth[key].append(value)
                columns["uid"].append(uid)
                columns["traj_uid"].append(traj_uid)
                columns["rewards"].append(np.float32(rewards[t]))
                columns["is_action_valid"].append(np.bool_(valid))
                columns["anchor_obs"].append(obs)
                columns["active_masks"].append(True)
                columns["episode_rewards"].append(np.float32(rewards.sum()))
                lengths.append(int(rng.integers(1, response_length + 1)))
    n = len(lengths)
    non_tensor = {k: np.array(v, dtype=object) for k, v in columns.items()}
    mask = torch.zeros(n, response_length, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    responses = torch.randint(3, 100, (n, response_length)) * mask
    tensors = {
        "responses": responses,
        "attention_mask": torch.cat([torch.ones(n, 5, dtype=torch.long), mask], dim=1),
        "response_mask": mask,
    }
    out = {k: np.asarray(v) for k, v in truth.items()}
    out["obs"] = out["obs"].astype(object)
    out["action"] = out["action"].astype(object)
    last = np.r_[out["traj"][1:] != out["traj"][:-1], True]
    out["won"] = last & (out["episode_reward"] >= 10.0)
    non_tensor[STEP_COLUMN] = step_tags(non_tensor["traj_uid"])
    non_tensor[ACTION_COLUMN] = out["action"].copy()
    return Batch(tensors, non_tensor), out


def pad_and_shuffle(batch: Batch, seed: int, copies: int) -> tuple[Batch, np.ndarray]:
    """``adjust_batch(mode="copy")`` then ``_balance_batch``: ``copies`` copies of random rows appended, then
    every row permuted. Returns the batch and, per row, the index of the original row it is."""
    rng = np.random.default_rng(seed)
    n = len(batch)
    origin = np.r_[np.arange(n), rng.choice(n, copies, replace=False)]
    padded = batch.concat(batch.select(origin[n:]))
    order = rng.permutation(origin.size)
    return padded.select(order), origin[order]


class VocabTokenizer:
    """A tokenizer stand-in: each distinct response text is one token id (0 pads), repeated over a length
    that depends on the text, so the rows' response masks differ."""

    def __init__(self, length: int = 6):
        self.length = length
        self.texts = [""]
        self.ids: dict[str, int] = {}

    def encode(self, texts) -> torch.Tensor:
        out = torch.zeros(len(texts), self.length, dtype=torch.long)
        for i, text in enumerate(texts):
            token = self.ids.setdefault(text, len(self.texts))
            if token == len(self.texts):
                self.texts.append(text)
            out[i, : 1 + len(text) % self.length] = token
        return out

    def batch_decode(self, responses: torch.Tensor, skip_special_tokens: bool = True) -> list[str]:
        assert skip_special_tokens
        return [self.texts[int(row[0])] for row in responses]


class ScriptedActor:
    """``actor(prompts) -> responses``: mostly the hint a toy ALFWorld observation gives ("Next you need to:
    X."), sometimes another admissible action from the prompt, sometimes an answer without tags (invalid)."""

    def __init__(self, seed: int, follow: float = 0.7, invalid: float = 0.1):
        self.rng = np.random.default_rng(seed)
        self.follow, self.invalid = follow, invalid

    def __call__(self, prompts) -> list[str]:
        out = []
        for prompt in prompts:
            hint = re.findall(r"Next you need to: (.+?)\.", prompt)
            listed = re.findall(r"^\s*'([^'\n]+)'$", prompt, re.MULTILINE)
            draw = self.rng.random()
            if draw < self.invalid or not listed:
                out.append("I would rather look around the room.")
            elif draw < self.invalid + self.follow and hint:
                out.append(f"<think>the hint</think><action>{hint[-1]}</action>")
            else:
                out.append(
                    f"<think>explore</think><action>{listed[int(self.rng.integers(len(listed)))]}</action>"
                )
        return out
