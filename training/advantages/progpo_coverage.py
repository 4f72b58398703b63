"""Progress-conditioned GPO — the earlier version of ProGPO (Fan & Liu, arXiv 2607.04242 v1), spec §6.1 (6).
**Reconstructed from a secondary summary**: "first-visit observation coverage used only when all samples in
a group have zero outcome reward".

Groups with some non-zero episode reward: plain GiGPO (A^E + step_weight * A^S).
All-failed groups (every episode reward is 0), our reading:

    novel(t)   = 1 if o_t is a first visit (``coverage="trajectory"``: not seen earlier in the same
                 trajectory; ``"group"``: not seen by any trajectory of the group at an earlier step)
    c_i        = sum_t novel(t) over trajectory i            (observation coverage)
    A^E        = normalize_g(c_i - penalty * invalid_row)    (same population rules as GRPO's A^E)
    b_t        = novel(t + 1) (0 on the last step)           (progress bonus of the step)
    A^S        = normalize over anchor group (task group, o_t) of (b_t - penalty * invalid_t)
    A          = A^E + step_weight * A^S
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import (
    combine_keys,
    dense_ids,
    discounted_returns,
    episode_advantage,
    group_outcome_advantage,
    group_scoped_ids,
    segment_normalize,
)
from training.advantages.params import StepWeightedParams, parse_enum, set_checked
from training.advantages.registry import register_estimator


class Coverage(str, Enum):
    """Which earlier visits make an observation "already seen"."""

    TRAJECTORY = "trajectory"
    GROUP = "group"


@dataclass(frozen=True)
class CoverageParams(StepWeightedParams):
    """Parameters of ``progpo_coverage``: GiGPO's shared ones (``gamma`` discounts the step return of groups
    with a non-zero reward; ``stats_scope`` is the population of the episode and coverage statistics) and the
    first-visit definition."""

    coverage: str = "trajectory"
    """``trajectory`` or ``group`` first-visit definition; becomes a :class:`Coverage`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(self, coverage=parse_enum(Coverage, self.coverage, "coverage"))


def first_visits(batch: StepBatch, coverage: Coverage) -> np.ndarray:
    """``[N]`` bool: the row's observation is a first visit under ``coverage``."""
    if coverage is Coverage.TRAJECTORY:
        traj_tag = (batch.traj.astype(np.uint64) + np.uint64(1)) * np.uint64(0xD6E8FEB86659FD93)
        ids, n = dense_ids(combine_keys(traj_tag, batch.obs))
        first = np.full(n, batch.n_rows, dtype=np.int64)
        np.minimum.at(first, ids, np.arange(batch.n_rows))
        return first[ids] == np.arange(batch.n_rows)
    ids, n = group_scoped_ids(batch, batch.obs)
    earliest = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(earliest, ids, batch.step)
    return batch.step == earliest[ids]


@register_estimator(
    "progpo_coverage",
    params=CoverageParams,
    episode_only={"step_weight": 0.0},
    renamed={"omega": "step_weight"},
)
def progpo_coverage(batch: StepBatch, params: CoverageParams) -> np.ndarray:
    """GiGPO with a first-visit coverage signal in groups where every episode failed.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        params: see :class:`CoverageParams`; ``invalid_penalty`` is subtracted from invalid rows' scores and
            step targets.

    Returns:
        ``[N]`` float64.

    Example:
        >>> from training.advantages import compute_advantages
        >>> b = {"group_id": np.zeros(4, int), "traj_id": np.array([0, 0, 1, 1]),
        ...      "step": np.array([0, 1, 0, 1]), "reward": np.zeros(4), "won": np.zeros(4, bool),
        ...      "valid": np.ones(4, bool), "obs_key": np.array([1, 2, 1, 1], dtype=np.uint64),
        ...      "action_key": np.zeros(4, np.uint64)}
        >>> np.round(compute_advantages("progpo_coverage", b, norm="mean"), 4).tolist()
        [1.1667, 0.5, -0.8333, -0.8333]
    """
    norm, eps, penalty, step_weight = params.norm, params.eps, params.invalid_penalty, params.step_weight
    invalid = (~batch.valid).astype(np.float64)
    anchor, n_anchor = group_scoped_ids(batch, batch.obs)

    adv_e = episode_advantage(batch, params)
    step_return = discounted_returns(batch, params.gamma) - penalty * invalid
    adv_s = segment_normalize(step_return, anchor, n_anchor, norm, eps, singleton="zero")

    novel = first_visits(batch, params.coverage)
    coverage_count = np.bincount(batch.traj, weights=novel, minlength=batch.n_traj)
    cov_e = group_outcome_advantage(
        batch,
        coverage_count[batch.traj] - penalty * invalid,
        coverage_count,
        norm=norm,
        stats_scope=params.stats_scope,
        eps=eps,
    )
    bonus = np.zeros(batch.n_rows)
    bonus[:-1] = novel[1:]
    bonus[batch.is_last] = 0.0
    cov_s = segment_normalize(bonus - penalty * invalid, anchor, n_anchor, norm, eps, singleton="zero")

    abs_return = np.bincount(batch.traj_group, weights=np.abs(batch.episode_return), minlength=batch.n_groups)
    all_failed = (abs_return == 0)[batch.group]
    return np.where(all_failed, cov_e + step_weight * cov_s, adv_e + step_weight * adv_s)
