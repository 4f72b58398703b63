"""DAPO (Yu et al. 2025, arXiv 2503.14476) as configured in verl-agent's examples (algorithms.md §2.3).

The advantage is GRPO's. DAPO's dynamic sampling drops every task group whose episode rewards (before the
invalid penalty) are all identical; a trainer that re-samples should filter with
:func:`dynamic_sampling_keep`. With ``drop_uniform_groups=True`` (default) the rows such a filter would
drop get advantage 0, which is their gradient contribution once dropped. Clip-higher (eps_low 0.2,
eps_high 0.28) belongs to the policy loss, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import episode_advantage
from training.advantages.params import NormalizedParams
from training.advantages.registry import register_estimator


@dataclass(frozen=True)
class DAPOParams(NormalizedParams):
    """DAPO's parameters: GRPO's and the dynamic-sampling filter."""

    drop_uniform_groups: bool = True
    """Zero the rows of groups with identical episode rewards (default); False gives plain GRPO (verl-agent's
    last, unfiltered generation batch)."""


def dynamic_sampling_keep(batch: StepBatch) -> np.ndarray:
    """``[N]`` bool: the row's task group has at least two distinct episode rewards (DAPO's filter)."""
    g, n = batch.traj_group, batch.n_groups
    rmax = np.full(n, -np.inf)
    rmin = np.full(n, np.inf)
    np.maximum.at(rmax, g, batch.episode_return)
    np.minimum.at(rmin, g, batch.episode_return)
    return (rmax != rmin)[batch.group]


@register_estimator("dapo", params=DAPOParams)
def dapo(batch: StepBatch, params: DAPOParams) -> np.ndarray:
    """GRPO advantage with DAPO's dynamic-sampling filter folded in.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: GRPO's (``norm``, ``stats_scope``, ``eps``, ``invalid_penalty``) and ``drop_uniform_groups``.

    Returns:
        ``[N]`` float64.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.array([0, 0, 1, 1]), "traj_id": np.arange(4), "step": np.zeros(4, int),
        ...      "reward": np.array([10.0, 0.0, 0.0, 0.0]), "won": np.array([True, False, False, False]),
        ...      "valid": np.array([True, True, True, False]), "obs_key": np.zeros(4, np.uint64),
        ...      "action_key": np.arange(4, dtype=np.uint64)}
        >>> compute_advantages("dapo", b, norm="mean").tolist()
        [5.0, -5.0, 0.0, 0.0]
    """
    adv = episode_advantage(batch, params)
    if params.drop_uniform_groups:
        adv = np.where(dynamic_sampling_keep(batch), adv, 0.0)
    return adv
