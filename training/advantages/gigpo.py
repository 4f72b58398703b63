"""GiGPO — Group-in-Group Policy Optimization (Feng et al., NeurIPS 2025, arXiv 2505.10978), §3 of the spec.

    Episode (Eq. 3):  A^E(tau_i) = (S_i - mean_g S) / F_norm        (cross-steps row scores, §1.3)
    Step return (5):  R_t = sum_{k>=t} gamma^(k-t) r_k  - penalty * invalid_t
    Anchor group (6): G^S(s) = {(a, R_t) : o_t = s, same task group, any trajectory, any t}
    Step adv. (7):    A^S = (R_t - mean_{G^S} R) / F_norm            singleton -> 0, all-equal -> 0
    Combined (8):     A = A^E + step_weight * A^S                    (the paper's omega)
If no state repeats, every anchor group is a singleton and GiGPO equals GRPO exactly (paper §6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import (
    discounted_returns,
    episode_advantage,
    group_scoped_ids,
    segment_normalize,
)
from training.advantages.params import StepWeightedParams, check_range, set_checked
from training.advantages.registry import register_estimator
from training.advantages.semantic import similarity_keys


@dataclass(frozen=True)
class GiGPOParams(StepWeightedParams):
    """GiGPO's parameters: the shared step-weighted ones (``gamma`` 0.95 and ``step_weight`` 1 as in the
    paper; ``norm`` ``mean_std`` in the ALFWorld script, ``mean`` in the WebShop one) and the anchor key."""

    enable_similarity: bool = False
    """Group anchor states by string similarity of ``obs_text`` instead of key equality."""
    similarity_thresh: float = 0.95
    """Similarity threshold in [0, 1] when ``enable_similarity``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self, similarity_thresh=check_range(self.similarity_thresh, "similarity_thresh", 0.0, 1.0)
        )


@register_estimator(
    "gigpo", params=GiGPOParams, episode_only={"step_weight": 0.0}, renamed={"omega": "step_weight"}
)
def gigpo(batch: StepBatch, params: GiGPOParams) -> np.ndarray:
    """GiGPO advantage: episode-level group advantage plus anchor-state step advantage.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: see :class:`GiGPOParams`; ``invalid_penalty`` is subtracted from invalid rows' episode score
            and step return.

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
    adv_e = episode_advantage(batch, params)
    step_return = discounted_returns(batch, params.gamma) - params.invalid_penalty * (~batch.valid)
    anchor = similarity_keys(batch, params.similarity_thresh) if params.enable_similarity else batch.obs
    seg, n_seg = group_scoped_ids(batch, anchor)
    adv_s = segment_normalize(step_return, seg, n_seg, params.norm, params.eps, singleton="zero")
    return adv_e + params.step_weight * adv_s
