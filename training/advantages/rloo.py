"""RLOO (Ahmadian et al. 2024, arXiv 2402.14740; Kool et al. 2019) as in verl-agent (algorithms.md §2.2).

    A_i = S_i - mean_{j != i}(S_j)  ==  n/(n-1) * (S_i - mean(S))          n > 1
    A_i = S_i                                                               n = 1
No std scaling. Under ``cross_steps`` the population is the group's rows (the code-faithful quirk: the
left-out element is one *row*); under ``trajectory`` it is the group's episode rewards, and the left-out
element is the row's own trajectory: A = S_row - (sum_j R_j - R_own) / (n - 1).
"""

from __future__ import annotations

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import row_scores
from training.advantages.params import SharedParams, StatsScope
from training.advantages.registry import register_estimator


@register_estimator("rloo", params=SharedParams)
def rloo(batch: StepBatch, params: SharedParams) -> np.ndarray:
    """REINFORCE leave-one-out baseline advantage per row (no std scaling, so no ``norm`` or ``eps``).

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: ``stats_scope`` (``cross_steps``: rows are the population, parity; or ``trajectory``) and
            ``invalid_penalty`` (subtracted from the score of each invalid row).

    Returns:
        ``[N]`` float64.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(3, int), "traj_id": np.arange(3), "step": np.zeros(3, int),
        ...      "reward": np.array([10.0, 0.0, 5.0]), "won": np.array([True, False, False]),
        ...      "valid": np.ones(3, bool), "obs_key": np.zeros(3, np.uint64),
        ...      "action_key": np.arange(3, dtype=np.uint64)}
        >>> compute_advantages("rloo", b).tolist()
        [7.5, -7.5, 0.0]
    """
    scores = row_scores(batch, params.invalid_penalty)
    g = batch.group
    if params.stats_scope is StatsScope.CROSS_STEPS:
        count = np.bincount(g, minlength=batch.n_groups)[g]
        total = np.bincount(g, weights=scores, minlength=batch.n_groups)[g]
        own = scores
    else:
        count = np.bincount(batch.traj_group, minlength=batch.n_groups)[g]
        total = np.bincount(batch.traj_group, weights=batch.episode_return, minlength=batch.n_groups)[g]
        own = batch.episode_return[batch.traj]
    others_mean = (total - own) / np.maximum(count - 1, 1)
    return np.where(count > 1, scores - others_mean, scores)
