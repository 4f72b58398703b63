"""Warm start: supervised fine-tuning on expert demonstrations before RL (for models that cannot act yet).

A tiny random-initialised policy never samples a well-formed ``<think>..</think><action>..</action>`` answer,
so RL has no signal to start from. The envs' experts (``expert=True`` puts the expert's next command in
``info["expert_action"]``) play the training tasks; every expert step becomes a supervised example whose
prompt is exactly the RL prompt (same harness template, same history) and whose response is the expert's
action in the answer format (:func:`agents.projection.demonstration_text`). Only response tokens carry loss
(token-mean over each batch).

Before imitation, ``warm_start.lm_epochs`` passes of next-token prediction over the demonstrations' *prompt*
text (:func:`prompt_corpus`, :func:`corpus_nll_sum`) give a randomly initialised model what a pretrained LLM
brings: reading its context. Imitation alone cannot teach it: the expert's ~160 "take X" decisions are too few
for a 2-layer model to learn to find X in the task line, and it instead memorises which object each training
room's tasks want (teacher-forced on expert steps, the quickstart's warm start picked the task's object 65% of
the time on training tasks and 30% on held-out ones, where picking at random gives 35-38%). The prompts hold
~100k tokens of copying (objects named in an observation return in the admissible list, the first
observation's task returns in the task line), and next-token prediction over them builds the copy circuits
that imitation then points at the task: with the quickstart's 10 passes the same probe picks the task's
object 97% of the time on training tasks and 90% on held-out ones (``scripts/reading_probe.py``).

**The whole answer.** Imitation is next-token prediction over the whole vocabulary, also when RL decodes
constrained (``rollout.constrained_actions``). Under constrained decoding the answer's fixed tokens
(``<think></think><action>``, ``</action>`` and the end-of-turn token) are the only continuation the trie
allows, so a loss renormalised over the allowed tokens gives them log-probability 0 and no gradient: the
policy never learned to write them, and sampled in free text (vLLM, a served export) it never stopped
(docs/quickstart.md, "Free text"). Over the whole vocabulary, ``-log p(y)`` is the constrained
loss plus ``-log p(allowed)`` at each step, both non-negative: the constrained objective loses nothing, and
the policy learns to put its mass on the answer's own tokens, stop token included.

The warm start works on explicit collaborators (the run's config, the model and its tokenizer, the device and
the distributed context), so the trainer, the probes and the benchmarks call it the same way.

Example:
    >>> demonstration_text("go to desk 1")  # what an expert step is trained as
    '<think></think><action>go to desk 1</action>'
    >>> stats = warm_start(config, model, tokenizer, "cpu", DistContext.from_env())  # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from agents.envs import num_tasks
from agents.projection import demonstration_text
from training.config import TrainConfig
from training.distributed import DistContext
from training.envs import make_split_envs
from training.loss import sft_loss_sum
from training.rollout import RolloutWorker, StepRows
from training.sampling import allowed_logits, pack_sequences, policy_logprobs


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
    config: TrainConfig,
    tokenizer,
    tasks: Sequence[int],
    split: str | None = None,
    batch_envs: int = 16,
    only_successful: bool = True,
    log: Callable[[str], None] = lambda message: None,
) -> tuple[StepRows, dict]:
    """Expert episodes on ``tasks`` of ``split`` (default: the training split; indices wrap around its size)
    as step rows (prompts as ``config.rollout`` builds them, tokenised by ``tokenizer``), only those that won
    by default; ``log`` hears how far it got, with the time left, after every batch of episodes."""
    rows = StepRows.empty()
    split = split or config.env.train_split
    envs = make_split_envs(config.env, split, min(batch_envs, len(tasks)), 1, expert=True)
    available = num_tasks(envs)
    tasks = [t % available for t in tasks]
    won = played = 0
    started = time.perf_counter()
    try:
        worker = RolloutWorker.from_config(envs, config, tokenizer)
        for start in range(0, len(tasks), envs.num_envs):
            chunk = [tasks[(start + j) % len(tasks)] for j in range(envs.num_envs)]  # wrap to fill the env
            fresh = min(envs.num_envs, len(tasks) - start)  # copies playing tasks not yet played
            result = worker.run(
                seed=config.seed + start,
                task_indices=chunk,
                scripted=lambda info: demonstration_text(str(info.get("expert_action", "look"))),
            )
            winners = {e.traj_id for e in result.episodes[:fresh] if e.won}
            kept = winners if only_successful else {e.traj_id for e in result.episodes[:fresh]}
            won += len(winners)
            played += fresh
            rows.extend(result.rows.select([i for i, t in enumerate(result.rows.traj_id) if t in kept]))
            left = (time.perf_counter() - started) / played * (len(tasks) - played)
            log(f"warm start: {played}/{len(tasks)} expert episodes ({won} won), about {left:.0f} s left")
    finally:
        envs.close()
    return rows, {
        "demo_episodes": float(played),
        "demo_expert_success": won / max(played, 1),
        "demo_steps": float(rows.num_rows),
    }


def prompt_corpus(rows: StepRows) -> list[list[int]]:
    """The distinct prompts of ``rows`` (token ids), in a fixed order: the text of the language-model stage.

    Example:
        >>> rows = StepRows.empty()
        >>> rows.prompt_ids += [[3, 4], [1, 2], [3, 4]]
        >>> prompt_corpus(rows)
        [[1, 2], [3, 4]]
    """
    return [list(p) for p in sorted({tuple(p) for p in rows.prompt_ids})]


def corpus_nll_sum(
    model: torch.nn.Module, texts: list[list[int]], vocab: torch.Tensor, pad_token_id: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood of ``texts`` (token ids, each at least 2 long), with the
    softmax taken over the corpus' own tokens ``vocab`` (sorted ids) instead of the whole vocabulary.

    Tokens that never occur in the corpus would only be pushed down; leaving them out keeps the output layer
    at ~100 rows instead of the quickstart's 65,536 (:func:`training.sampling.allowed_logits` computes just
    those). Each text is packed as a one-token prompt and a response, so every later token is predicted once.
    Returns the loss and the mask of the predicted tokens ``(rows, longest text - 1)``.
    """
    packed = pack_sequences([t[:1] for t in texts], [t[1:] for t in texts], pad_token_id, device)
    rows, width = packed.response_ids.shape
    index = vocab.to(packed.response_ids.device).view(1, 1, -1).expand(rows, width, -1)
    column = torch.searchsorted(index[0, 0].contiguous(), packed.response_ids).clamp(max=len(vocab) - 1)
    logprobs = torch.log_softmax(allowed_logits(model, packed, index), -1)
    token_logprobs = logprobs.gather(-1, column.unsqueeze(-1)).squeeze(-1)
    return sft_loss_sum(token_logprobs, packed.response_mask), packed.response_mask


def _fit(
    config: TrainConfig,
    model: torch.nn.Module,
    dist: DistContext,
    lengths: list[int],
    epochs: int,
    batch_loss: Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]],
    what: str,
) -> list[float]:
    """AdamW (``warm_start.lr``, linear decay) over length-bucketed batches of item indices; returns each
    epoch's mean token NLL.

    ``batch_loss(indices) -> (summed NLL, token mask)``. Every rank steps on every batch: a rank whose share
    of a batch is empty runs the batch's first item with weight 0, so the ranks' FSDP collectives stay
    paired; the loss is normalised by the tokens of the whole batch over all ranks.
    """
    cfg = config.warm_start
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    rng = np.random.default_rng(config.seed)
    total_steps = epochs * len(length_bucketed_batches(lengths, cfg.batch_rows, rng))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(total_steps, 1))
    model.train()
    losses = []
    for _epoch in range(epochs):
        epoch_loss, epoch_tokens = 0.0, 0.0
        for batch in length_bucketed_batches(lengths, cfg.batch_rows, rng):
            mine = dist.shard(batch)
            weight = 1.0 if mine else 0.0
            loss_sum, mask = batch_loss(mine or batch[:1])
            tokens = dist.all_reduce_sum(float(mask.sum()) * weight)
            optimizer.zero_grad(set_to_none=True)
            (loss_sum * weight * dist.world_size / max(tokens, 1.0)).backward()
            torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            epoch_loss += float(loss_sum.detach()) * weight
            epoch_tokens += float(mask.sum()) * weight
        losses.append(epoch_loss / max(epoch_tokens, 1.0))
        dist.log(f"{what} epoch {len(losses)}/{epochs}: token NLL {losses[-1]:.3f}")
    return losses


def warm_start(
    config: TrainConfig, model: torch.nn.Module, tokenizer, device, dist: DistContext
) -> dict[str, Any]:
    """Collect demonstrations, train ``model`` on their prompts' text (``warm_start.lm_epochs``), then
    fine-tune it on the expert's responses (``warm_start.epochs``); returns statistics.

    Args:
        config: The run's configuration (``warm_start``, ``env``, ``rollout``, ``seed``, ``optim.grad_clip``).
        model: The policy, trained in place (FSDP2-sharded under torchrun).
        tokenizer: Its tokenizer.
        device: Where the batches go.
        dist: The distributed context (batches are shared out over ranks; the main rank logs).
    """
    cfg = config.warm_start
    started = time.perf_counter()
    dist.log(f"warm start: playing the expert on {cfg.num_tasks} training tasks")
    rows, stats = collect_demonstrations(
        config, tokenizer, range(cfg.num_tasks), only_successful=cfg.only_successful, log=dist.log
    )
    t_collect = time.perf_counter() - started
    pad = tokenizer.pad_token_id

    corpus = [p for p in prompt_corpus(rows) if len(p) > 1]
    if cfg.lm_epochs and corpus:
        vocab = torch.tensor(sorted({t for p in corpus for t in p}))
        lm_losses = _fit(
            config,
            model,
            dist,
            [len(p) for p in corpus],
            cfg.lm_epochs,
            lambda batch: corpus_nll_sum(model, [corpus[i] for i in batch], vocab, pad, device),
            "warm start, prompt text",
        )
        stats.update(
            {
                "lm_texts": float(len(corpus)),
                "lm_vocab": float(len(vocab)),
                "lm_loss_first_epoch": lm_losses[0],
                "lm_loss_last_epoch": lm_losses[-1],
            }
        )
    t_lm = time.perf_counter() - started - t_collect

    def imitation_loss(batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        packed = pack_sequences(
            [rows.prompt_ids[i] for i in batch], [rows.response_ids[i] for i in batch], pad, device
        )
        # over the whole vocabulary, also when RL decodes constrained (module docstring, "The whole answer")
        responses = [rows.response_ids[i] for i in batch]
        logprobs = policy_logprobs(model, packed, responses, [[] for _ in batch])
        return sft_loss_sum(logprobs, packed.response_mask), packed.response_mask

    lengths = [len(p) + len(r) for p, r in zip(rows.prompt_ids, rows.response_ids, strict=True)]
    losses = _fit(config, model, dist, lengths, cfg.epochs, imitation_loss, "warm start")
    stats.update(
        {
            "sft_loss_first_epoch": losses[0] if losses else 0.0,
            "sft_loss_last_epoch": losses[-1] if losses else 0.0,
            "time_collect": t_collect,
            "time_lm": t_lm,
            "time_sft": time.perf_counter() - started - t_collect - t_lm,
        }
    )
    return stats
