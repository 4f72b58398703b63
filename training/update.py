"""One PPO micro-step and the update's metrics: the pieces :meth:`training.trainer.Trainer.update` loops over.

The trainer cuts the step rows into shuffled mini-batches (one optimizer step each) and those into
micro-batches (gradient accumulation). For each micro-batch, :func:`pack_micro_batch` pads and packs the rows
(:class:`MicroBatch`), :func:`micro_step` runs the forward and backward pass of the clipped token-level
objective with KL to the reference and the entropy bonus (:mod:`training.loss`) and returns the loss terms
(:class:`MicroStepTerms`), and :class:`UpdateMetrics` sums them into the update's statistics.

Example:
    >>> metrics = UpdateMetrics()
    >>> metrics.add_grad_norm(2.0)
    >>> metrics.summary()
    {'grad_norm': 2.0, 'update_tokens': 0.0}
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from training.config import LossConfig
from training.loss import PolicyLossTerms, kl_k3, masked_sum, policy_loss_terms
from training.policy import compute_context
from training.rollout import StepRows
from training.sampling import PackedBatch, pack_sequences, policy_logprobs, policy_logprobs_and_entropy


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
    """One optimizer step of an epoch: its micro-batches and the token-mean denominator.

    Attributes:
        global_tokens: Response tokens of the mini-batch summed over every rank.
        micros: ``(row indices, weight)`` per micro-batch; weight 0 marks a pass that only keeps ranks in
            step.
    """

    global_tokens: float
    micros: list[tuple[list[int], float]]


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
    """

    packed: PackedBatch
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    responses: list[list[int]]
    choices: list[list[list[int]]]


def pack_micro_batch(
    rows: StepRows,
    advantages: np.ndarray,
    indices: Sequence[int],
    pad_token_id: int,
    device,
    old_logprobs: Sequence[Sequence[float]] | None = None,
) -> MicroBatch:
    """The rows ``indices`` of ``rows`` with their ``advantages``, packed on ``device``.

    ``old_logprobs`` (one list per row of ``rows``) replaces the sampler's recorded log-probs as pi_old: the
    training model's own, recomputed by :func:`recompute_old_logprobs`."""
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
    return MicroBatch(packed, mask, old, adv, responses, choices)


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
    micro_batches: Sequence[Sequence[int]],
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
        micro_batches: Row indices of every micro-batch of the first epoch, in order (rows may repeat: the
            zero-weight passes that keep ranks in step; every rank must run the same number of forwards).
        pad_token_id: Padding id.
        temperature: The sampling temperature.
        numerics: The update's autocast dtype and logit chunking.

    Returns:
        One list of log-probs per row (the recorded ones for rows no micro-batch covers).
    """
    old = [list(lp) for lp in rows.old_logprobs]
    no_advantages = np.zeros(len(rows.response_ids))
    for indices in micro_batches:
        batch = pack_micro_batch(rows, no_advantages, indices, pad_token_id, numerics.device)
        with numerics.forward():
            logprobs = policy_logprobs(
                model, batch.packed, batch.responses, batch.choices, temperature, numerics.chunk_tokens
            )
        for r, i in enumerate(indices):
            old[i] = logprobs[r, : len(rows.response_ids[i])].float().tolist()
    return old


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
        self.first_ratio_dev = [0.0, 0.0, 0.0]  # sum of |ratio - 1|, tokens, max

    def add_micro_step(
        self, batch: MicroBatch, terms: MicroStepTerms, first_epoch: bool, before_first_step: bool
    ) -> None:
        """Add one (weighted) micro-step's sums (``before_first_step``: it belongs to the first mini-batch of
        the first epoch)."""
        if before_first_step:
            deviation = ((terms.logprobs - batch.old_logprobs).exp() - 1).abs() * batch.mask
            self.first_ratio_dev[0] += float(deviation.sum())
            self.first_ratio_dev[1] += float(batch.mask.sum())
            self.first_ratio_dev[2] = max(self.first_ratio_dev[2], float(deviation.max()))
        if first_epoch and not self.first_check:  # pi_old vs trainer log-probs before any step
            diff = (terms.logprobs - batch.old_logprobs).abs() * batch.mask
            self.first_check = {
                "first_ratio_mean": float(terms.policy.ratio_sum / batch.mask.sum().clamp(min=1)),
                "logprob_diff_max": float(diff.max()),
            }
        count = float(batch.mask.sum())
        self.tokens += count
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

    def summary(self) -> dict[str, float]:
        """Token means of the sums, the first check, the mean gradient norm and the tokens trained on."""
        out = {k: v / max(self.tokens, 1.0) for k, v in self.sums.items()}
        out.update(self.first_check)
        if self.first_ratio_dev[1]:
            out["first_ratio_mean_abs_dev"] = self.first_ratio_dev[0] / self.first_ratio_dev[1]
            out["first_ratio_max_abs_dev"] = self.first_ratio_dev[2]
        out["grad_norm"] = float(np.mean(self.grad_norms)) if self.grad_norms else 0.0
        out["update_tokens"] = self.tokens
        return out
