"""GRPO (Shao et al. 2024, arXiv 2402.03300) as used for agents in verl-agent (algorithms.md §2.1).

S_i = R_traj(i) - penalty * invalid_i                   (row score, §1.2)
A_i = (S_i - mean_g(S)) / (std_g(S) + eps)              norm="mean_std"
A_i =  S_i - mean_g(S)                                  norm="mean"   (Dr.GRPO)
singleton population: mean 0, std 1; all-equal group: 0
"""

from __future__ import annotations

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import episode_advantage
from training.advantages.params import NormalizedParams
from training.advantages.registry import register_estimator


@register_estimator("grpo", params=NormalizedParams)
def grpo(batch: StepBatch, params: NormalizedParams) -> np.ndarray:
    """Group Relative Policy Optimization advantage: the group-normalised episode score of each row.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: ``norm`` (``mean_std`` z-score, default, or ``mean``), ``stats_scope`` (``cross_steps``, every
            row counts, verl-agent parity, or ``trajectory``), ``eps``, ``invalid_penalty``.

    Returns:
        ``[N]`` float64; under ``cross_steps`` the advantages of a group (of >= 2 rows) sum to 0.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(3, int), "traj_id": np.array([0, 0, 1]), "step": np.array([0, 1, 0]),
        ...      "reward": np.array([0.0, 10.0, 0.0]), "won": np.array([False, True, False]),
        ...      "valid": np.ones(3, bool), "obs_key": np.arange(3, dtype=np.uint64),
        ...      "action_key": np.arange(3, dtype=np.uint64)}
        >>> np.round(compute_advantages("grpo", b, norm="mean"), 4).tolist()
        [3.3333, 3.3333, -6.6667]
    """
    return episode_advantage(batch, params)
