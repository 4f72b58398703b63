"""The PPO-style token-level objective of verl-agent (``docs/algorithms.md`` §8), pure tensors.

Per response token with advantage ``A`` (the step row's advantage broadcast over its tokens)::

    ρ      = exp(log π_θ − log π_old)
    L_clip = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))
    L_pg   = min(L_clip, −A·c)   for A < 0 (dual clip, Ye et al. 2020), L_clip otherwise
    KL_k3  = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1, clamped to [−10, 10]   (Schulman's k3)
    L      = token_mean(L_pg) + β·token_mean(KL_k3) − η·token_mean(entropy)

Rows sampled by an older policy than the one being updated (asynchronous rollouts, ``rollout.max_staleness``
≥ 1) use the decoupled objective: π_old is then the *proximal* policy (the current weights before the update,
recomputed) and each token's ``L_pg`` is weighted by the truncated importance weight
``w = min(π_prox / π_behaviour, C)`` of the policy that actually sampled it (``weights``; see
:func:`policy_loss_terms`). On-policy rows have no weight (``w`` is never applied), so without stale rows the
loss is exactly the one above.

``token_mean`` divides by the number of response tokens of the whole mini-batch (verl's ``token-mean``), so
each micro-batch contributes ``sum / total_tokens`` and gradient accumulation gives exactly the mini-batch
mean.

Example:
    >>> import torch
    >>> logp = torch.log(torch.tensor([[0.5, 0.5]]))
    >>> out = policy_loss_terms(logp, logp, torch.tensor([[1.0, 1.0]]), torch.tensor([[1, 0]]),
    ...                         clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    >>> out.pg_sum.item(), out.ratio_sum.item()
    (-1.0, 1.0)
"""

from __future__ import annotations

import dataclasses

import torch

#: verl clamps the k3 estimate to this range to keep rare huge ratios from dominating.
KL_CLAMP = 10.0


@dataclasses.dataclass
class PolicyLossTerms:
    """Sums over the masked tokens of one micro-batch (divide by the mini-batch token count for token-mean).

    Attributes:
        pg_sum: Sum of the clipped policy-gradient loss.
        ratio_sum: Sum of ρ (for the mean ratio metric).
        clipped_sum: Tokens where the clip (either side) was active.
        dual_clipped_sum: Tokens where the dual clip was active.
        approx_kl_sum: Sum of ``log π_old − log π_θ`` (PPO's approximate KL to the sampler).
    """

    pg_sum: torch.Tensor
    ratio_sum: torch.Tensor
    clipped_sum: torch.Tensor
    dual_clipped_sum: torch.Tensor
    approx_kl_sum: torch.Tensor


def policy_loss_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float,
    weights: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """Clipped (and dual-clipped) policy-gradient loss over tokens; all inputs ``(B, R)``.

    ``weights`` (detached, ``(B, R)``, or ``None``) multiply each token's clipped loss: the behaviour-policy
    correction of decoupled PPO for rows sampled by an older policy — the objective of Hilton et al. 2021
    ("Batch size-invariance for policy optimization", arXiv 2110.00641), as AReaL uses it for asynchronous
    RL (Fu et al. 2025, arXiv 2505.24298, eq. 5): the ratio is clipped against the proximal policy
    (``old_logprobs`` = the current weights' log-probs), and ``π_prox / π_behaviour`` reweights the token,
    truncated at a cap as in IMPALA's V-trace (Espeholt et al. 2018, arXiv 1802.01561) and in truncated
    importance sampling for sampler/trainer mismatch (Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"). ``None`` leaves the loss exactly unweighted.

    Args:
        logprobs: ``log π_θ`` of the response tokens (differentiable).
        old_logprobs: ``log π_old`` recorded at sampling.
        advantages: Per-token advantages (the row advantage repeated over its tokens).
        mask: 1 on response tokens, 0 on padding (prompt tokens are never in these tensors).
        clip_low: ε_low.
        clip_high: ε_high.
        dual_clip: ``c`` (> 1), or 0 to disable.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).to(mask.dtype)
    dual_active = torch.zeros_like(mask)
    if dual_clip:
        bound = -advantages * dual_clip
        dual = torch.minimum(loss, bound)
        negative = advantages < 0
        dual_active = (negative & (loss > bound)).to(mask.dtype)
        loss = torch.where(negative, dual, loss)
    if weights is not None:
        loss = loss * weights
    return PolicyLossTerms(
        pg_sum=(loss * mask).sum(),
        ratio_sum=(ratio.detach() * mask).sum(),
        clipped_sum=(clip_active * mask).sum(),
        dual_clipped_sum=(dual_active * mask).sum(),
        approx_kl_sum=(-log_ratio.detach() * mask).sum(),
    )


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref), clamped to ``[-10, 10]`` (non-negative in exact arithmetic).

    Example:
        >>> import torch
        >>> kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item()
        0.0
    """
    delta = ref_logprobs - logprobs
    return torch.clamp(torch.exp(delta) - delta - 1.0, -KL_CLAMP, KL_CLAMP)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1."""
    return (values * mask.to(values.dtype)).sum()


def sft_loss_sum(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the masked (response) tokens (warm start)."""
    return -masked_sum(logprobs, mask)
