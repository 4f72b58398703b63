"""Warm start: supervised fine-tuning on expert demonstrations before RL (for models that cannot act yet).

A tiny random-initialised policy never samples a well-formed ``<think>..</think><action>..</action>`` answer,
so RL has no signal to start from. The envs' experts (``expert=True`` puts the expert's next command in
``info["expert_action"]``) play the training tasks; every expert step becomes a supervised example whose
prompt is exactly the RL prompt (same harness template, same history) and whose response is the expert's
action in the answer format (:func:`demonstration_text`). Only response tokens carry loss (token-mean over
each batch).

Example:
    >>> demonstration_text("go to desk 1")
    '<think></think><action>go to desk 1</action>'
    >>> demonstration_text("go to desk 1", think="the mug may be on the desk")
    '<think>the mug may be on the desk</think><action>go to desk 1</action>'
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from training.loss import sft_loss_sum
from training.rollout import StepRows
from training.sampling import pack_sequences, policy_logprobs

if TYPE_CHECKING:
    from training.trainer import Trainer


def demonstration_text(action: str, think: str = "") -> str:
    """The answer an expert step is trained as: a reasoning block, then the action.

    The RL papers' format requires a ``<think>`` block (the projection marks answers without one invalid). The
    experts give no reasoning, and a tiny model cannot learn real reasoning from minutes of data, so by
    default the block is empty: the demonstration teaches the format and the action, every response token is
    spent on the action (the tags alone cost ~15 tokens), and nothing pretends to be reasoning.
    """
    return f"<think>{think}</think><action>{action}</action>"


def length_bucketed_batches(
    lengths: list[int], batch_rows: int, rng: np.random.Generator, window_batches: int = 16
) -> list[list[int]]:
    """Row indices cut into shuffled batches of similar length.

    A random permutation is cut into windows of ``window_batches`` batches; each window is sorted by length
    before it is cut into batches, and the batch order is shuffled. Which rows can meet stays random, but a
    batch pads to a near neighbour's length instead of the longest of ``batch_rows`` random rows (ALFWorld
    prompts run from ~300 to ~900 tokens, so random batches spend about a third of their compute on padding).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> batches = length_bucketed_batches([5, 1, 4, 2, 3, 6], 2, rng, window_batches=3)
        >>> sorted(i for b in batches for i in b), sorted(len(b) for b in batches)
        ([0, 1, 2, 3, 4, 5], [2, 2, 2])
    """
    n = len(lengths)
    order = rng.permutation(n).tolist()
    window = max(1, batch_rows * window_batches)
    batches: list[list[int]] = []
    for start in range(0, n, window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        parts = max(1, math.ceil(len(chunk) / batch_rows))
        batches += [chunk[p * len(chunk) // parts : (p + 1) * len(chunk) // parts] for p in range(parts)]
    return [batches[i] for i in rng.permutation(len(batches))] if n else []


def collect_demonstrations(
    trainer: Trainer, num_tasks: int, batch_envs: int = 16, only_successful: bool = True
) -> tuple[StepRows, dict]:
    """Expert episodes on training tasks ``0..num_tasks-1`` as step rows (only those that won, by default)."""
    rows = StepRows.empty()
    envs = trainer._make_envs(trainer.config.env.train_split, min(batch_envs, num_tasks), 1, expert=True)
    available = trainer._num_tasks(envs)
    tasks = [t % available for t in range(num_tasks)]
    won = played = 0
    try:
        worker = trainer._worker(envs)
        for start in range(0, len(tasks), envs.num_envs):
            chunk = [tasks[(start + j) % len(tasks)] for j in range(envs.num_envs)]  # wrap to fill the env
            fresh = min(envs.num_envs, len(tasks) - start)  # copies playing tasks not yet played
            result = worker.run(
                seed=trainer.config.seed + start,
                task_indices=chunk,
                scripted=lambda info: demonstration_text(str(info.get("expert_action", "look"))),
            )
            winners = {e.traj_id for e in result.episodes[:fresh] if e.won}
            kept = winners if only_successful else {e.traj_id for e in result.episodes[:fresh]}
            won += len(winners)
            played += fresh
            rows.extend(result.rows.select([i for i, t in enumerate(result.rows.traj_id) if t in kept]))
    finally:
        envs.close()
    return rows, {
        "demo_episodes": float(played),
        "demo_expert_success": won / max(played, 1),
        "demo_steps": float(rows.num_rows),
    }


def warm_start(trainer: Trainer) -> dict[str, Any]:
    """Collect demonstrations and fine-tune ``trainer.model`` on them; returns statistics."""
    cfg = trainer.config.warm_start
    started = time.perf_counter()
    rows, stats = collect_demonstrations(trainer, cfg.num_tasks, only_successful=cfg.only_successful)
    t_collect = time.perf_counter() - started
    model, dist = trainer.model, trainer.dist
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    model.train()
    rng = np.random.default_rng(trainer.config.seed)
    lengths = [len(p) + len(r) for p, r in zip(rows.prompt_ids, rows.response_ids, strict=True)]
    num_batches = len(length_bucketed_batches(lengths, cfg.batch_rows, rng))
    total_steps = cfg.epochs * num_batches
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(total_steps, 1))
    losses = []
    for _epoch in range(cfg.epochs):
        epoch_loss, epoch_tokens = 0.0, 0.0
        for batch in length_bucketed_batches(lengths, cfg.batch_rows, rng):
            mine = dist.shard(batch)
            weight = 1.0 if mine else 0.0
            mine = mine or batch[:1]
            tokens = dist.all_reduce_sum(sum(len(rows.response_ids[i]) for i in mine) if weight else 0)
            packed = pack_sequences(
                [rows.prompt_ids[i] for i in mine],
                [rows.response_ids[i] for i in mine],
                trainer.tokenizer.pad_token_id,
                trainer.device,
            )
            logprobs = policy_logprobs(
                model,
                packed,
                [rows.response_ids[i] for i in mine],
                [rows.choices[i] for i in mine],
            )
            loss_sum = sft_loss_sum(logprobs, packed.response_mask)
            optimizer.zero_grad(set_to_none=True)
            (loss_sum * weight * dist.world_size / max(tokens, 1.0)).backward()
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], trainer.config.optim.grad_clip
            )
            optimizer.step()
            scheduler.step()
            epoch_loss += float(loss_sum.detach()) * weight
            epoch_tokens += float(packed.response_mask.sum()) * weight
        losses.append(epoch_loss / max(epoch_tokens, 1.0))
        trainer._log(f"warm start epoch {len(losses)}/{cfg.epochs}: token NLL {losses[-1]:.3f}")
    stats.update(
        {
            "sft_loss_first_epoch": losses[0] if losses else 0.0,
            "sft_loss_last_epoch": losses[-1] if losses else 0.0,
            "time_collect": t_collect,
            "time_sft": time.perf_counter() - started - t_collect,
        }
    )
    return stats
