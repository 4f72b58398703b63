"""Estimator parameters: the shared dataclasses every estimator's parameters extend, and their checks.

An estimator's parameters are one frozen dataclass, named by its registration
(``@register_estimator("gigpo", params=GiGPOParams)``). The registry takes the accepted keyword names from its
fields and builds it from the caller's keywords, so ``__post_init__`` is where values are checked (the error
names the parameter) and converted (strings to enums, numbers to float); the estimator reads the validated
values. The keys several estimators share are declared once, in three nested bases:

    SharedParams        stats_scope, invalid_penalty   every estimator: the episode score (spec §1.2-1.3)
    NormalizedParams    + norm, eps                    normalisation within groups, F_norm (§1.4)
    StepWeightedParams  + gamma, step_weight           A = A^E + step_weight * A^step, discounted returns

Example:
    >>> NormalizedParams(norm="mean").norm
    <Norm.MEAN: 'mean'>
    >>> NormalizedParams(eps=0.0)
    Traceback (most recent call last):
    ValueError: parameter 'eps'=0.0 must lie in (0.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np


class Norm(str, Enum):
    """Group normaliser F_norm (GiGPO Eq. 3/7): z-score (``mean_std``) or mean-centring only (``mean``)."""

    MEAN_STD = "mean_std"
    MEAN = "mean"


class StatsScope(str, Enum):
    """Population of the episode-level group statistics (algorithms.md §1.3).

    ``cross_steps``: every step row counts once (verl-agent ``compute_mean_std_cross_steps=True``, parity
    default). ``trajectory``: every trajectory counts once with its episode reward (textbook GRPO/RLOO).
    """

    CROSS_STEPS = "cross_steps"
    TRAJECTORY = "trajectory"


def parse_enum(enum_cls: type[Enum], value: object, param: str) -> Enum:
    """Convert a string (or member) to ``enum_cls``; unknown values raise ``ValueError`` naming ``param``."""
    try:
        return enum_cls(value)
    except ValueError:
        choices = [m.value for m in enum_cls]
        raise ValueError(f"parameter {param!r}: unknown value {value!r}; choose one of {choices}") from None


def check_range(value: float, param: str, low: float, high: float, *, low_open: bool = False) -> float:
    """Return ``float(value)`` if it lies in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    v = float(value)
    if not np.isfinite(v) or v > high or v < low or (low_open and v == low):
        bracket = "(" if low_open else "["
        raise ValueError(f"parameter {param!r}={value!r} must lie in {bracket}{low}, {high}]")
    return v


def set_checked(params: object, **values: object) -> None:
    """Store validated values on a frozen parameters dataclass (for use in ``__post_init__``)."""
    for name, value in values.items():
        object.__setattr__(params, name, value)


@dataclass(frozen=True)
class SharedParams:
    """The parameters of every estimator: its episode score and the population of its statistics.

    Every estimator's parameters extend this class, so the trainer can pass ``invalid_penalty`` (from
    ``algo.invalid_penalty``) to any of them.
    """

    stats_scope: str = "cross_steps"
    """Population of the episode statistics: ``cross_steps`` (every row, verl-agent parity) or ``trajectory``;
    becomes a :class:`StatsScope`."""
    invalid_penalty: float = 0.1
    """Subtracted from an invalid row's score (and, where there is one, its step target); >= 0."""

    def __post_init__(self) -> None:
        set_checked(
            self,
            stats_scope=parse_enum(StatsScope, self.stats_scope, "stats_scope"),
            invalid_penalty=check_range(self.invalid_penalty, "invalid_penalty", 0.0, np.inf),
        )


@dataclass(frozen=True)
class NormalizedParams(SharedParams):
    """Parameters of an estimator that normalises within groups (GRPO's and every step-level method's)."""

    norm: str = "mean_std"
    """``mean_std`` (z-score) or ``mean`` (mean-centring only), at every level; becomes a :class:`Norm`."""
    eps: float = 1e-6
    """Added to every std; in (0, 1]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self,
            norm=parse_enum(Norm, self.norm, "norm"),
            eps=check_range(self.eps, "eps", 0.0, 1.0, low_open=True),
        )


@dataclass(frozen=True)
class StepWeightedParams(NormalizedParams):
    """Parameters of an estimator ``A = A^E + step_weight * A^step`` whose step term uses discounted returns
    (GiGPO Eq. 8; G2PO, ProGPO and its coverage variant). ``step_weight=0`` leaves the episode term."""

    gamma: float = 0.95
    """Discount of step returns / state values, in [0, 1] (GiGPO's 0.95)."""
    step_weight: float = 1.0
    """Weight of the step advantage against the episode advantage (the papers' omega)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        set_checked(
            self, gamma=check_range(self.gamma, "gamma", 0.0, 1.0), step_weight=float(self.step_weight)
        )
