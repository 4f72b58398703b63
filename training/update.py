"""The PPO update: global mini-batches of step rows, micro-batches with gradient accumulation, one optimizer
step per mini-batch (:func:`ppo_update`), and the pieces it loops over.

:func:`plan_update` cuts the iteration's step rows into shuffled mini-batches of ``optim.mini_batch_rows``
rows **of the whole batch** (every rank's rows together, as verl's global ``ppo_mini_batch_size``), so the
same config takes the same number of optimizer steps on 1 GPU or 8 and, on the same rows, lands on the same
weights; each rank runs its own share of a mini-batch in micro-batches of ``optim.micro_batch_rows`` rows
(a per-GPU size). For each micro-batch, :func:`pack_micro_batch` pads and packs the rows
(:class:`MicroBatch`), :func:`micro_step` runs the forward and backward pass of the clipped token-level
objective with KL to the reference and the entropy bonus (:mod:`training.loss`) and returns the loss terms
(:class:`MicroStepTerms`), and :class:`UpdateMetrics` sums them into the update's statistics, with the gap
between the sampler's log-probs and the trained policy's (:class:`LogprobGap`), which a broken weight sync
makes grow (:class:`SamplerGapError`).

The trainer builds its optimizer with :func:`make_optimizer`, and each iteration calls :func:`step_advantages`
(one advantage per row from the configured estimator, on the rows of the groups no env failure cut short),
:func:`rows_to_train` (the rows the update keeps: never those of an env-failed group) and
:func:`update_policy` (the seeded plan and the PPO update over it).

Example:
    >>> metrics = UpdateMetrics()
    >>> metrics.add_grad_norm(2.0)
    >>> metrics.summary()["grad_norm"], metrics.optimizer_steps
    (2.0, 1)
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from training.advantages import compute_advantages
from training.config import AlgoConfig, LossConfig, OptimConfig, TrainConfig
from training.distributed import DistContext
from training.loss import PolicyLossTerms, kl_k3, masked_sum, policy_loss_terms
from training.policy import compute_context
from training.rollout import RolloutResult, StepRows, mixed_outcome_groups
from training.sampling import PackedBatch, pack_sequences, policy_logprobs, policy_logprobs_and_entropy
from training.seeds import derive_seed
from training.update_size import snapshot_parameters, update_size


@dataclasses.dataclass(frozen=True)
class Numerics:
    """How the update's forward passes compute.

    Attributes:
        device: Where the model runs.
        compute_dtype: Autocast dtype over the fp32 master weights (``model.compute_dtype`` resolved;
            float32 = no autocast). See :func:`training.policy.compute_context`.
        chunk_tokens: Response positions whose vocabulary-sized logits exist at once
            (``optim.logit_chunk_tokens``; 0 = all).
    """

    device: torch.device
    compute_dtype: torch.dtype = torch.float32
    chunk_tokens: int = 1024

    def forward(self):
        """The context a forward pass runs in (autocast, or nothing for float32)."""
        return compute_context(self.device, self.compute_dtype)


@dataclasses.dataclass
class MiniBatchPlan:
    """One optimizer step: this rank's micro-batches of it and the token-mean denominator.

    Attributes:
        global_tokens: Response tokens of the whole mini-batch (every rank's rows).
        micros: ``(row indices, weight)`` per micro-batch of this rank; weight 0 marks a pass that only keeps
            ranks in step (every rank runs the same number of forward/backward passes: FSDP2's collectives).
    """

    global_tokens: float
    micros: list[tuple[list[int], float]]


def plan_update(
    rows: StepRows,
    kept: np.ndarray,
    *,
    epochs: int,
    mini_batch_rows: int,
    micro_batch_rows: int,
    rng: np.random.Generator,
    dist: DistContext,
) -> list[list[MiniBatchPlan]]:
    """Every epoch's mini-batches over the kept rows of *every* rank, and this rank's micro-batches of each.

    The rows of all ranks are put in one canonical order — by ``(step, traj_id)``, the order a single process
    plays them in — and each epoch shuffles that order with ``rng`` (the same on every rank) and cuts it into
    ``ceil(kept rows / mini_batch_rows)`` mini-batches of near-equal size. A mini-batch is therefore the same
    set of rows whatever the number of ranks, and each rank runs its own rows of it in micro-batches of
    ``micro_batch_rows``; a rank with fewer micro-batches than another runs zero-weight passes over one of its
    rows. The number of optimizer steps is ``epochs × ceil(kept rows / mini_batch_rows)`` on any number of
    ranks. (With dynamic sampling a single process plays its rounds one after the other; the canonical order
    interleaves them, a different shuffle of the same rows.)

    Args:
        rows: This rank's step rows.
        kept: Bool per row of ``rows``: rows left out have no loss terms and no tokens in the denominator.
        epochs: Passes over the batch (``loss.ppo_epochs``).
        mini_batch_rows: Rows of the whole batch per optimizer step (``optim.mini_batch_rows``, global).
        micro_batch_rows: Rows per forward/backward on this rank (``optim.micro_batch_rows``, per GPU).
        rng: The iteration's shuffle generator, seeded alike on every rank.
        dist: This process's place in the job (one ``all_gather`` of the row keys).

    Example:
        >>> rows = StepRows.empty()
        >>> rows.step += [0, 0, 1]; rows.traj_id += [0, 1, 0]; rows.response_ids += [[1], [2, 3], [4]]
        >>> plan = plan_update(rows, np.ones(3, bool), epochs=1, mini_batch_rows=2, micro_batch_rows=1,
        ...                    rng=np.random.default_rng(0), dist=DistContext())
        >>> [(mini.global_tokens, len(mini.micros)) for mini in plan[0]]
        [(1.0, 1), (3.0, 2)]
    """
    tokens = [len(r) for r in rows.response_ids]
    tables = dist.gather_objects((list(rows.step), list(rows.traj_id), tokens, [bool(k) for k in kept]))
    owner = np.concatenate([np.full(len(t[0]), r, dtype=np.int64) for r, t in enumerate(tables)])
    local = np.concatenate([np.arange(len(t[0]), dtype=np.int64) for t in tables])
    steps, trajs, counts, keep = (np.concatenate([np.asarray(t[k]) for t in tables]) for k in range(4))
    canonical = np.lexsort((trajs, steps)) if len(steps) else np.zeros(0, dtype=np.int64)
    plans = []
    for _ in range(epochs):
        order = canonical[rng.permutation(len(canonical))]
        order = order[keep[order].astype(bool)] if len(order) else order
        mine = [int(local[i]) for i in order if owner[i] == dist.rank]
        filler = mine[0] if mine else (0 if rows.num_rows else None)  # a row for zero-weight passes
        n = len(order)
        num_minis = max(1, math.ceil(n / mini_batch_rows))
        epoch = []
        for m in range(num_minis):
            mini = order[m * n // num_minis : (m + 1) * n // num_minis]
            per_rank = np.bincount(owner[mini], minlength=dist.world_size) if len(mini) else [0]
            num_micros = max(1, *(math.ceil(int(c) / micro_batch_rows) for c in per_rank))
            here = [int(local[i]) for i in mini if owner[i] == dist.rank]
            micros = []
            for k in range(num_micros):
                micro = here[k * micro_batch_rows : (k + 1) * micro_batch_rows]
                if micro or filler is not None:
                    micros.append((micro, 1.0) if micro else ([filler], 0.0))
            epoch.append(MiniBatchPlan(float(counts[mini].sum()) if len(mini) else 0.0, micros))
        plans.append(epoch)
    return plans


@dataclasses.dataclass
class MicroBatch:
    """The rows of one micro-batch, packed for the forward pass (``R`` rows, ``T`` response tokens at most).

    Attributes:
        packed: Prompts and responses, padded (:func:`training.sampling.pack_sequences`).
        mask: ``(R, T)`` float, 1 on response tokens.
        old_logprobs: ``(R, T)`` the log-probs recorded at sampling (0 past each response).
        advantages: ``(R, T)`` each row's advantage broadcast over its tokens.
        responses: The response token ids of each row.
        choices: Each row's constrained-decoding candidates (empty lists for free text).
        current: ``(R, 1)`` float, 1 on rows sampled by the policy being updated (0: by an older one).
        weights: ``(R, T)`` the behaviour-policy weights of the stale rows' tokens (1 on current rows), or
            ``None`` when every row is current (:func:`behaviour_weights`).
    """

    packed: PackedBatch
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    responses: list[list[int]]
    choices: list[list[list[int]]]
    current: torch.Tensor
    weights: torch.Tensor | None = None


def pack_micro_batch(
    rows: StepRows,
    advantages: np.ndarray,
    indices: Sequence[int],
    pad_token_id: int,
    device,
    old_logprobs: Sequence[Sequence[float]] | None = None,
    stale: np.ndarray | None = None,
    weights: Sequence[Sequence[float] | None] | None = None,
) -> MicroBatch:
    """The rows ``indices`` of ``rows`` with their ``advantages``, packed on ``device``.

    ``old_logprobs`` (one list per row of ``rows``) replaces the sampler's recorded log-probs as pi_old: the
    training model's own, recomputed by :func:`recompute_old_logprobs`. ``stale`` (bool per row of ``rows``)
    marks the rows an older policy sampled and ``weights`` holds their tokens' behaviour weights
    (:func:`behaviour_weights`; ``None`` for current rows)."""
    old_source = rows.old_logprobs if old_logprobs is None else old_logprobs
    packed = pack_sequences(
        [rows.prompt_ids[i] for i in indices],
        [rows.response_ids[i] for i in indices],
        pad_token_id,
        device,
    )
    mask = packed.response_mask.float()
    width = mask.shape[1]
    old = torch.zeros_like(mask)
    for r, i in enumerate(indices):
        old[r, : len(old_source[i])] = torch.tensor(old_source[i])
    adv = torch.tensor([advantages[i] for i in indices], dtype=torch.float32, device=device)[:, None].expand(
        -1, width
    )
    responses = [rows.response_ids[i] for i in indices]
    choices = [rows.choices[i] for i in indices]
    is_stale = [bool(stale[i]) if stale is not None else False for i in indices]
    current = torch.tensor([[0.0 if s else 1.0] for s in is_stale], device=device)
    row_weights = None
    if weights is not None and any(is_stale):
        row_weights = torch.ones_like(mask)
        for r, i in enumerate(indices):
            if weights[i] is not None:
                row_weights[r, : len(weights[i])] = torch.tensor(weights[i])
    return MicroBatch(packed, mask, old, adv, responses, choices, current, row_weights)


@dataclasses.dataclass
class MicroStepTerms:
    """What one micro-step computed (sums over its masked tokens).

    Attributes:
        policy: The clipped policy-gradient terms (:class:`training.loss.PolicyLossTerms`).
        kl_sum: Summed k3 KL to the reference (0 without one).
        entropy_sum: Summed entropy of the policy.
        logprobs: ``(R, T)`` the trained policy's log-probs of the responses (detached).
    """

    policy: PolicyLossTerms
    kl_sum: torch.Tensor
    entropy_sum: torch.Tensor
    logprobs: torch.Tensor


def micro_step(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    batch: MicroBatch,
    loss: LossConfig,
    temperature: float,
    scale: float,
    numerics: Numerics,
) -> MicroStepTerms:
    """Forward ``batch`` through ``model`` (and the frozen ``reference``), and backpropagate the objective
    ``pg + kl_coef·KL − entropy_coef·H`` (token sums) times ``scale``; gradients accumulate in ``model``.

    Args:
        model: The trained policy.
        reference: The KL reference (``None``: no KL term).
        batch: The packed micro-batch.
        loss: Clip ranges and coefficients.
        temperature: The sampling temperature the log-probs are taken at.
        scale: The micro-batch's share of the mini-batch's token mean (0 for a pass that only keeps ranks in
            step).
        numerics: Autocast dtype and logit chunking of the forward passes.
    """
    with numerics.forward():
        logprobs, entropy = policy_logprobs_and_entropy(
            model, batch.packed, batch.responses, batch.choices, temperature, numerics.chunk_tokens
        )
        ref = None
        if reference is not None:
            with torch.no_grad():
                ref = policy_logprobs(
                    reference,
                    batch.packed,
                    batch.responses,
                    batch.choices,
                    temperature,
                    numerics.chunk_tokens,
                )
    terms = policy_loss_terms(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        clip_low=loss.clip_low,
        clip_high=loss.clip_high,
        dual_clip=loss.dual_clip,
        weights=batch.weights,
    )
    kl_sum = masked_sum(kl_k3(logprobs, ref), batch.mask) if ref is not None else torch.zeros(())
    entropy_sum = masked_sum(entropy, batch.mask)
    objective = terms.pg_sum + loss.kl_coef * kl_sum - loss.entropy_coef * entropy_sum
    (objective * scale).backward()
    return MicroStepTerms(terms, kl_sum, entropy_sum, logprobs.detach())


@torch.no_grad()
def recompute_old_logprobs(
    model: torch.nn.Module,
    rows: StepRows,
    micro_batches: Sequence[tuple[Sequence[int], float]],
    pad_token_id: int,
    temperature: float,
    numerics: Numerics,
) -> list[list[float]]:
    """pi_old recomputed by the training model, in the update's own numeric path (verl's default).

    The sampler's recorded log-probs come from KV-cached decoding (and, with vLLM, other kernels); in bf16
    they differ from a full forward pass of the trained model by far more than PPO's clip range allows for
    noise, so the first ratio starts away from 1. Recomputing pi_old with the same forward, over the same
    micro-batches as the first epoch (same padding, so the same kernels and the same rounding), makes the
    first mini-batch's ratio exactly 1 (``first_ratio_max_abs_dev``).

    Args:
        model: The trained policy, before the update.
        rows: The iteration's step rows.
        micro_batches: ``(row indices, weight)`` of every micro-batch of the first epoch, in order. The
            zero-weight passes that keep ranks in step run their forward (every rank must run as many) but
            are not recorded: their row's pi_old comes from its own, real micro-batch.
        pad_token_id: Padding id.
        temperature: The sampling temperature.
        numerics: The update's autocast dtype and logit chunking.

    Returns:
        One list of log-probs per row (the recorded ones for rows no micro-batch covers).
    """
    old = [list(lp) for lp in rows.old_logprobs]
    no_advantages = np.zeros(len(rows.response_ids))
    for indices, weight in micro_batches:
        batch = pack_micro_batch(rows, no_advantages, indices, pad_token_id, numerics.device)
        with numerics.forward():
            logprobs = policy_logprobs(
                model, batch.packed, batch.responses, batch.choices, temperature, numerics.chunk_tokens
            )
        if weight:
            for r, i in enumerate(indices):
                old[i] = logprobs[r, : len(rows.response_ids[i])].float().tolist()
    return old


def behaviour_weights(
    behaviour: Sequence[Sequence[float]],
    proximal: Sequence[Sequence[float]],
    stale: np.ndarray,
    cap: float,
) -> list[list[float] | None]:
    """Per stale row, each token's truncated importance weight ``min(π_prox / π_behaviour, cap)``
    (:func:`training.loss.policy_loss_terms`); ``None`` for the rows the current policy sampled.

    Example:
        >>> behaviour_weights([[-1.0, -2.0], [-1.0]], [[-0.5, -3.0], [-1.0]], np.array([True, False]), 1.5)
        [[1.5, 0.36787944117144233], None]
    """
    out: list[list[float] | None] = []
    for b, p, s in zip(behaviour, proximal, stale, strict=True):
        if not s:
            out.append(None)
            continue
        ratio = np.exp(np.asarray(p, dtype=np.float64) - np.asarray(b, dtype=np.float64))
        out.append(np.minimum(ratio, cap).tolist())
    return out


def stale_weight_metrics(weights: Sequence[list[float] | None], cap: float, dist: DistContext) -> dict:
    """``behaviour_weight_mean`` and ``behaviour_weight_truncated_frac`` over the stale rows' tokens, and
    ``stale_tokens``: how many there are (every rank)."""
    stale_tokens = [w for row in weights if row is not None for w in row]
    all_tokens = dist.all_reduce_sum(float(sum(len(row) for row in weights if row is not None)))
    total = dist.all_reduce_sum(float(sum(stale_tokens)))
    truncated = dist.all_reduce_sum(float(sum(w >= cap for w in stale_tokens)))
    return {
        "behaviour_weight_mean": total / max(all_tokens, 1.0),
        "behaviour_weight_truncated_frac": truncated / max(all_tokens, 1.0),
        "stale_tokens": all_tokens,
    }


class SamplerGapError(RuntimeError):
    """The sampler's log-probs are further from the trained policy's than ``rollout.max_sampler_logprob_gap``
    allows: the rollouts were not sampled from the policy being trained."""


@dataclasses.dataclass
class LogprobGap:
    """Sums of ``|log π_a − log π_b|`` over response tokens (this rank's, or every rank's after
    :meth:`all_reduce`).

    Example:
        >>> gap = LogprobGap()
        >>> gap.add(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]), torch.tensor([[1.0, 1.0]]))
        >>> gap.metrics("gap")
        {'gap_mean': 0.25, 'gap_max': 0.5}
    """

    total: float = 0.0
    tokens: float = 0.0
    largest: float = 0.0

    def add(self, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the masked tokens of two ``(R, T)`` log-prob tensors."""
        diff = (a.float() - b.float()).abs() * mask
        self.total += float(diff.sum())
        self.tokens += float(mask.sum())
        self.largest = max(self.largest, float(diff.max()) if diff.numel() else 0.0)

    def add_lists(self, a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> None:
        """Add per-row log-prob lists (rows of equal lengths in ``a`` and ``b``)."""
        for x, y in zip(a, b, strict=True):
            if len(x):
                diff = np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64))
                self.total += float(diff.sum())
                self.tokens += float(diff.size)
                self.largest = max(self.largest, float(diff.max()))

    def all_reduce(self, dist: DistContext) -> LogprobGap:
        """The sums over every rank."""
        total, tokens = dist.all_reduce_sum(self.total), dist.all_reduce_sum(self.tokens)
        return LogprobGap(total, tokens, dist.all_reduce_max(self.largest))

    @property
    def mean(self) -> float:
        """Mean gap per token (0 without tokens)."""
        return self.total / self.tokens if self.tokens else 0.0

    def metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix_mean, prefix_max}``."""
        return {f"{prefix}_mean": self.mean, f"{prefix}_max": self.largest}


class UpdateMetrics:
    """Sums micro-step terms and gradient norms into the update's statistics (token means).

    ``first_ratio_mean`` and ``logprob_diff_max`` compare the trainer's log-probs with pi_old on the first
    micro-batch; ``first_ratio_mean_abs_dev`` and ``first_ratio_max_abs_dev`` are the mean and max of
    ``|ratio - 1|`` over every token of the first mini-batch, before any optimizer step: how far pi_old (the
    sampler's log-probs, or the training model's own with ``algo.recompute_old_logprobs``) is from the
    policy the update differentiates, which PPO's clipping assumes to be 0 at the start.
    """

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.first_check: dict[str, float] = {}
        self.tokens = 0.0
        self.grad_norms: list[float] = []
        self.first_ratio_dev = LogprobGap()  # |ratio - 1| over the first mini-batch's tokens
        #: The trained policy's log-probs against pi_old over the first mini-batch, before any step.
        self.first_logprob_gap = LogprobGap()
        self.optimizer_steps = 0
        self.sequence_tokens = 0.0  # Σ s and Σ s² over the rows trained on (model FLOPs: training.costs)
        self.squared_tokens = 0.0

    def add_micro_step(
        self, batch: MicroBatch, terms: MicroStepTerms, first_epoch: bool, before_first_step: bool
    ) -> None:
        """Add one (weighted) micro-step's sums (``before_first_step``: it belongs to the first mini-batch of
        the first epoch)."""
        if before_first_step:
            ratio = (terms.logprobs - batch.old_logprobs).exp()
            self.first_ratio_dev.add(ratio, torch.ones_like(ratio), batch.mask)
            # the sampler's gap: on the rows the current weights sampled (a stale row's pi_old is recomputed)
            self.first_logprob_gap.add(terms.logprobs, batch.old_logprobs, batch.mask * batch.current)
        if first_epoch and not self.first_check:  # pi_old vs trainer log-probs before any step
            diff = (terms.logprobs - batch.old_logprobs).abs() * batch.mask
            self.first_check = {
                "first_ratio_mean": float(terms.policy.ratio_sum / batch.mask.sum().clamp(min=1)),
                "logprob_diff_max": float(diff.max()),
            }
        count = float(batch.mask.sum())
        self.tokens += count
        lengths = batch.packed.attention_mask.sum(-1).double()  # prompt + response positions of each row
        self.sequence_tokens += float(lengths.sum())
        self.squared_tokens += float((lengths * lengths).sum())
        self.sums["pg_loss"] += float(terms.policy.pg_sum.detach())
        self.sums["ratio"] += float(terms.policy.ratio_sum.detach())
        self.sums["clip_frac"] += float(terms.policy.clipped_sum.detach())
        self.sums["dual_clip_frac"] += float(terms.policy.dual_clipped_sum.detach())
        self.sums["approx_kl"] += float(terms.policy.approx_kl_sum.detach())
        self.sums["kl"] += float(terms.kl_sum.detach())
        self.sums["entropy"] += float(terms.entropy_sum.detach())

    def add_grad_norm(self, norm: float) -> None:
        """Add one optimizer step's gradient norm (before clipping)."""
        self.grad_norms.append(norm)
        self.optimizer_steps += 1

    def summary(self, dist: DistContext | None = None) -> dict[str, float]:
        """Token means of the sums over every rank (``dist``), the first check (this rank's first
        micro-batch), the mean gradient norm (global already) and the tokens trained on."""
        dist = dist or DistContext()
        tokens = dist.all_reduce_sum(self.tokens)
        out = {k: dist.all_reduce_sum(v) / max(tokens, 1.0) for k, v in sorted(self.sums.items())}
        out.update(self.first_check)
        first_ratio_dev = self.first_ratio_dev.all_reduce(dist)
        if first_ratio_dev.tokens:
            out["first_ratio_mean_abs_dev"] = first_ratio_dev.mean
            out["first_ratio_max_abs_dev"] = first_ratio_dev.largest
        out["grad_norm"] = float(np.mean(self.grad_norms)) if self.grad_norms else 0.0
        out["update_tokens"] = tokens
        out["update_sequence_tokens"] = dist.all_reduce_sum(self.sequence_tokens)
        out["update_squared_tokens"] = dist.all_reduce_sum(self.squared_tokens)
        return out


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """What :func:`ppo_update` takes from the run's config.

    Attributes:
        loss: Clip ranges and coefficients (``loss``).
        temperature: The sampling temperature the log-probs are taken at (``rollout.temperature``).
        grad_clip: Max global gradient norm (``optim.grad_clip``).
        recompute_old_logprobs: pi_old from the trained model, not the sampler
            (``algo.recompute_old_logprobs``).
        max_sampler_logprob_gap: Stop before the first optimizer step when the mean gap between the sampler's
            and the trained policy's log-probs exceeds it (``rollout.max_sampler_logprob_gap``; 0 = never).
        behaviour_weight_cap: Truncation of the stale rows' behaviour weights (``loss.behaviour_weight_cap``).
    """

    loss: LossConfig
    temperature: float
    grad_clip: float
    recompute_old_logprobs: bool
    max_sampler_logprob_gap: float = 0.0
    behaviour_weight_cap: float = 2.0

    @classmethod
    def from_config(cls, config: TrainConfig) -> UpdateSettings:
        """The settings of ``config``."""
        return cls(
            loss=config.loss,
            temperature=config.rollout.temperature,
            grad_clip=config.optim.grad_clip,
            recompute_old_logprobs=config.algo.recompute_old_logprobs,
            max_sampler_logprob_gap=config.rollout.max_sampler_logprob_gap,
            behaviour_weight_cap=config.loss.behaviour_weight_cap,
        )


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None,
    rows: StepRows,
    advantages: np.ndarray,
    plan: list[list[MiniBatchPlan]],
    settings: UpdateSettings,
    *,
    numerics: Numerics,
    dist: DistContext,
    pad_token_id: int,
    stale: np.ndarray | None = None,
) -> dict[str, float]:
    """PPO epochs over the planned mini-batches (:func:`plan_update`): one optimizer step each, gradients
    accumulated over its micro-batches (:func:`micro_step`). Returns the update's statistics: loss, ratio,
    KL and entropy token means, ``optimizer_steps``, the tokens trained on (``update_tokens``: response
    tokens; ``update_sequence_tokens``/``update_squared_tokens``: Σs and Σs² of prompt + response, every
    epoch, for the model FLOPs of :func:`training.costs.forward_flops`),
    ``params_changed_frac``/``update_to_weight_ratio`` (:mod:`training.update_size`), and
    ``sampler_logprob_gap_mean``/``_max`` — ``|log π_sampler − log π_trainer|`` per response token: over
    every row from the recomputed pi_old with ``recompute_old_logprobs``, else over the first mini-batch
    before its step.

    Under FSDP2 each rank scales its micro-batch losses by ``world_size / global_tokens``: the gradient
    all-reduce averages over ranks, so the step follows the exact token mean of the whole mini-batch.

    ``stale`` (bool per row) marks rows an older policy sampled (asynchronous rollouts): their pi_old is the
    proximal policy — the current weights, recomputed before the first step — and their tokens are weighted by
    the truncated behaviour weights ``min(π_prox / π_sampler, behaviour_weight_cap)`` (decoupled PPO,
    :func:`training.loss.policy_loss_terms`; ``behaviour_weight_*`` and ``stale_tokens`` in the statistics).
    Without stale rows nothing of this runs, and the update is exactly the on-policy one. The sampler gap is
    measured on the current rows only.

    Raises:
        SamplerGapError: the sampler gap's mean exceeds ``settings.max_sampler_logprob_gap``, raised before
            the first optimizer step (the weights are left as they were).
    """
    model.train()
    old_logprobs = weights = None
    sampler_gap = LogprobGap()
    stale = np.zeros(rows.num_rows, dtype=bool) if stale is None else np.asarray(stale, dtype=bool)
    any_stale = dist.all_reduce_sum(int(stale.sum())) > 0  # every rank recomputes alike (FSDP2)
    stale_metrics: dict[str, float] = {}
    if (settings.recompute_old_logprobs or any_stale) and plan:
        first_epoch = [micro for mini in plan[0] for micro in mini.micros]
        proximal = recompute_old_logprobs(
            model, rows, first_epoch, pad_token_id, settings.temperature, numerics
        )
        current = [i for i in range(rows.num_rows) if not stale[i]]
        if settings.recompute_old_logprobs:
            old_logprobs = proximal
            sampler_gap.add_lists([rows.old_logprobs[i] for i in current], [proximal[i] for i in current])
        else:  # only the stale rows need the proximal policy; the current ones keep the sampler's, as ever
            old_logprobs = [proximal[i] if stale[i] else rows.old_logprobs[i] for i in range(rows.num_rows)]
        if any_stale:
            weights = behaviour_weights(rows.old_logprobs, proximal, stale, settings.behaviour_weight_cap)
            stale_metrics = stale_weight_metrics(weights, settings.behaviour_weight_cap, dist)
    # the optimizer's own (under FSDP2: sharded) parameters; the module may show the root's gathered ones
    params = [p for group in optimizer.param_groups for p in group["params"]]
    before = snapshot_parameters(params)
    metrics = UpdateMetrics()
    for epoch, minis in enumerate(plan):
        for mini_index, mini in enumerate(minis):
            optimizer.zero_grad(set_to_none=True)
            first_step = epoch == 0 and mini_index == 0
            for micro, weight in mini.micros:
                batch = pack_micro_batch(
                    rows, advantages, micro, pad_token_id, numerics.device, old_logprobs, stale, weights
                )
                scale = weight * dist.world_size / max(mini.global_tokens, 1.0)
                terms = micro_step(
                    model, reference, batch, settings.loss, settings.temperature, scale, numerics
                )
                if weight:
                    metrics.add_micro_step(batch, terms, first_epoch=epoch == 0, before_first_step=first_step)
            if first_step:
                if not settings.recompute_old_logprobs:  # pi_old is the sampler's: the first pass measured it
                    sampler_gap = metrics.first_logprob_gap
                sampler_gap = sampler_gap.all_reduce(dist)
                _check_sampler_gap(sampler_gap, settings.max_sampler_logprob_gap)
            norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            metrics.add_grad_norm(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
            optimizer.step()
    out = metrics.summary(dist)
    out["optimizer_steps"] = float(metrics.optimizer_steps)
    out.update(sampler_gap.metrics("sampler_logprob_gap"))
    out.update(stale_metrics)
    out.update(update_size(before, params).all_reduce(dist.all_reduce_sum).metrics())
    return out


def _check_sampler_gap(gap: LogprobGap, bound: float) -> None:
    if bound > 0 and gap.mean > bound:
        raise SamplerGapError(
            f"the sampler's log-probs are {gap.mean:.3g} nats per token from the trained policy's "
            f"(mean |log pi_sampler - log pi_trainer|, max {gap.largest:.3g}; "
            f"rollout.max_sampler_logprob_gap={bound:g}): the rollouts were not sampled from the weights "
            "being trained — most likely the weight sync into the rollout engine is broken"
        )


# ------------------------------------------------------------------------------------- the trainer's calls
def make_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the model's trainable parameters (``optim.lr``, ``optim.betas``, ``optim.weight_decay``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)


def step_advantages(result: RolloutResult, algo: AlgoConfig) -> np.ndarray:
    """One advantage per step row of ``result`` from the configured estimator (``algo.name``,
    :func:`training.advantages.compute_advantages` on the rows' columns, with ``algo.invalid_penalty``).

    The rows of the groups an env failure cut short (:meth:`~training.rollout.RolloutResult.env_failed_rows`)
    are not shown to the estimator and get 0: the baselines are the healthy groups' alone. Without env
    failures the estimator sees every row, as it always did.
    """
    rows, failed = result.rows, result.env_failed_rows()
    healthy = rows.select(np.flatnonzero(~failed).tolist()) if failed.any() else rows
    advantages = np.zeros(rows.num_rows)
    if healthy.num_rows:
        advantages[~failed] = compute_advantages(
            algo.name, healthy.estimator_columns(), invalid_penalty=algo.invalid_penalty, **algo.params
        )
    return advantages


def rows_to_train(result: RolloutResult, exclude_uniform_groups: bool) -> np.ndarray:
    """Bool per row of ``result``: the rows the update trains on. Every row but those of the groups an env
    failure cut short (their tokens have no loss terms and no place in the denominator), or with
    ``loss.exclude_uniform_groups`` (DAPO) only the rows of groups whose episodes did not all score the same:
    such a group's advantages teach nothing."""
    kept = ~result.env_failed_rows()
    if exclude_uniform_groups:
        kept[:] = False
        kept[mixed_outcome_groups(result)[0]] = True
    return kept


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None,
    rows: StepRows,
    advantages: np.ndarray,
    kept: np.ndarray,
    *,
    config: TrainConfig,
    iteration: int,
    numerics: Numerics,
    dist: DistContext,
    pad_token_id: int,
    stale: np.ndarray | None = None,
) -> dict[str, float]:
    """Iteration ``iteration``'s PPO update (:func:`ppo_update` over :func:`plan_update`'s mini-batches of the
    ``kept`` rows); ``{"update_skipped": 1.0}`` when no rank kept a row. ``stale``: bool per row, rows an
    older policy sampled (none by default).

    The shuffle is seeded alike on every rank (the mini-batches are global); its seed's last part, 0, is the
    rank a single process always had, so a single-process run repeats earlier runs exactly."""
    if dist.all_reduce_sum(int(kept.sum())) == 0:
        return {"update_skipped": 1.0}
    plan = plan_update(
        rows,
        kept,
        epochs=config.loss.ppo_epochs,
        mini_batch_rows=config.optim.mini_batch_rows,
        micro_batch_rows=config.optim.micro_batch_rows,
        rng=np.random.default_rng(derive_seed(config.seed, "shuffle", iteration, 0)),
        dist=dist,
    )
    return ppo_update(
        model,
        optimizer,
        reference,
        rows,
        advantages,
        plan,
        UpdateSettings.from_config(config),
        numerics=numerics,
        dist=dist,
        pad_token_id=pad_token_id,
        stale=stale,
    )
