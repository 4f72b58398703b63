"""GiGPO — Group-in-Group Policy Optimization (Feng et al., NeurIPS 2025, arXiv 2505.10978), §3 of the spec.

    Episode (Eq. 3):  A^E(tau_i) = (S_i - mean_g S) / F_norm        (cross-steps row scores, §1.3)
    Step return (5):  R_t = sum_{k>=t} gamma^(k-t) r_k  - penalty * invalid_t
    Anchor group (6): G^S(s) = {(a, R_t) : o_t = s, same task group, any trajectory, any t}
    Step adv. (7):    A^S = (R_t - mean_{G^S} R) / F_norm            singleton -> 0, all-equal -> 0
    Combined (8):     A = A^E + step_weight * A^S                    (the paper's omega)
If no state repeats, every anchor group is a singleton and GiGPO equals GRPO exactly (paper §6).
"""

from __future__ import annotations

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import (
    check_range,
    check_shared_params,
    discounted_returns,
    episode_advantage,
    group_scoped_ids,
    segment_normalize,
)
from training.advantages.registry import register_estimator
from training.advantages.semantic import similarity_keys


@register_estimator("gigpo")
def gigpo(
    batch: StepBatch,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm: str = "mean_std",
    stats_scope: str = "cross_steps",
    eps: float = 1e-6,
    invalid_penalty: float = 0.1,
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
) -> np.ndarray:
    """GiGPO advantage: episode-level group advantage plus anchor-state step advantage.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        gamma: discount of the step return (paper 0.95).
        step_weight: weight of the step advantage A^S (the paper's omega, 1.0).
        norm: ``"mean_std"`` (ALFWorld script) or ``"mean"`` (WebShop script), used at both levels.
        stats_scope: population of the episode statistics.
        eps: added to the std.
        invalid_penalty: subtracted from invalid rows' episode score and step return.
        enable_similarity: group anchor states by string similarity of ``obs_text`` instead of key equality.
        similarity_thresh: similarity threshold (0..1) when ``enable_similarity``.

    Returns:
        ``[N]`` float64.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(3, int), "traj_id": np.array([0, 0, 1]), "step": np.array([0, 1, 0]),
        ...      "reward": np.array([0.0, 10.0, 0.0]), "won": np.array([False, True, False]),
        ...      "valid": np.ones(3, bool), "obs_key": np.array([7, 8, 7], dtype=np.uint64),
        ...      "action_key": np.arange(3, dtype=np.uint64)}
        >>> np.round(compute_advantages("gigpo", b, norm="mean"), 4).tolist()
        [8.0833, 3.3333, -11.4167]
    """
    shared = check_shared_params(
        norm=norm, stats_scope=stats_scope, eps=eps, invalid_penalty=invalid_penalty, gamma=gamma
    )
    adv_e = episode_advantage(batch, shared)
    step_return = discounted_returns(batch, shared.gamma) - shared.invalid_penalty * (~batch.valid)
    if enable_similarity:
        anchor = similarity_keys(batch, check_range(similarity_thresh, "similarity_thresh", 0.0, 1.0))
    else:
        anchor = batch.obs
    seg, n_seg = group_scoped_ids(batch, anchor)
    adv_s = segment_normalize(step_return, seg, n_seg, shared.norm, shared.eps, singleton="zero")
    return adv_e + float(step_weight) * adv_s
