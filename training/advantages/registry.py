"""Estimator registry: ``ESTIMATORS`` (name -> :class:`Estimator`) and ``compute_advantages`` (the only entry
point the training loop uses).

Everything the rest of the suite knows about an estimator is stated once, in its registration::

    @register_estimator("gigpo", params=GiGPOParams, episode_only={"step_weight": 0.0},
                        renamed={"omega": "step_weight"})
    def gigpo(batch: StepBatch, params: GiGPOParams) -> np.ndarray: ...    # [N], canonical order

``params`` is a frozen dataclass extending :class:`~training.advantages.params.SharedParams`: its fields are
the accepted keywords and its ``__post_init__`` checks their values. ``episode_only`` are the parameter
values that switch the step term off and leave the trajectory-level (episode) advantage (empty for an
estimator without a step term: GRPO, RLOO, DAPO); the credit diagnostics subtract that episode part, and the
tests check that it is trajectory-level. ``renamed`` maps old keyword names to new ones, so an old name is
rejected with an error naming its new name. The config (``algo.params``), the diagnostics and the tests read
these facts from ``ESTIMATORS``; adding an estimator is the checklist in ``docs/algorithms.md`` §10.

The registered :class:`Estimator` accepts a plain column mapping and keyword parameters, validates both,
calls the function with a canonical :class:`StepBatch` and the built parameters, and returns advantages in
the caller's row order.

Every estimator of the papers is *group-local*: rows of different task groups never interact. The wrapper
therefore evaluates it on chunks of whole task groups of about ``CHUNK_ROWS`` (64k) rows, so the working
set stays in cache and the cost is linear in rows. An estimator that needs batch-wide statistics registers
with ``group_local=False`` and sees the whole batch at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.params import SharedParams

EstimatorFn = Callable[[StepBatch, Any], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered estimator: its function and the facts about it that callers read.

    Calling it computes advantages: ``ESTIMATORS["gigpo"](batch, gamma=0.9)`` is
    ``compute_advantages("gigpo", batch, gamma=0.9)``.

    Example:
        >>> gigpo = ESTIMATORS["gigpo"]
        >>> gigpo.parameters[:6]
        ('stats_scope', 'invalid_penalty', 'norm', 'eps', 'gamma', 'step_weight')
        >>> dict(gigpo.episode_only), dict(gigpo.renamed)
        ({'step_weight': 0.0}, {'omega': 'step_weight'})
        >>> gigpo.config(gamma=0.9).gamma
        0.9
    """

    name: str
    """Registry key."""
    fn: EstimatorFn
    """``fn(batch: StepBatch, params) -> [N] float64`` in canonical row order."""
    params: type[SharedParams]
    """The parameters dataclass; its fields are the accepted keywords."""
    episode_only: Mapping[str, object]
    """Parameter values that leave only the trajectory-level (episode) advantage; empty: no step term."""
    renamed: Mapping[str, str]
    """Old keyword name -> new name."""
    group_local: bool
    """The result for a task group depends on that group's rows only (evaluated by chunks)."""

    @property
    def parameters(self) -> tuple[str, ...]:
        """The accepted keyword names, in the order of the params dataclass's fields."""
        return tuple(f.name for f in dataclasses.fields(self.params))

    def config(self, **params: object) -> SharedParams:
        """The validated parameters dataclass built from keyword ``params``.

        Raises:
            ValueError: an unknown or a renamed name (naming the new one), or a bad value (naming it).
        """
        check_parameter_names(self.name, params, self.parameters)
        return self.params(**params)

    def __call__(self, batch: Mapping | StepBatch, **params: object) -> np.ndarray:
        """``[N]`` float64 advantages of ``batch`` (a column mapping or ``StepBatch``) in its row order."""
        cfg = self.config(**params)
        steps = StepBatch.from_columns(batch)
        if steps.n_rows == 0:
            return np.zeros(0, dtype=np.float64)
        bounds = steps.chunk_bounds if self.group_local else np.array([0, steps.n_rows])
        if bounds.size == 2:
            adv = np.asarray(self.fn(steps, cfg), dtype=np.float64)
        else:
            parts = [self.fn(steps.rows(lo, hi), cfg) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
            adv = np.concatenate(parts).astype(np.float64, copy=False)
        return steps.unsort(adv)


ESTIMATORS: dict[str, Estimator] = {}


def check_parameter_names(name: str, given: Iterable[str], allowed: Sequence[str]) -> None:
    """Reject parameter names that estimator ``name`` does not accept, naming the new name of a renamed one.

    Args:
        name: registry key of the estimator (its registration's ``renamed`` gives the old names).
        given: the parameter names a caller passed.
        allowed: the estimator's parameter names (listed in the error).

    Raises:
        ValueError: a renamed parameter (the message names its new name), or unknown ones.

    Example:
        >>> check_parameter_names("gigpo", ["omega"], ["gamma", "step_weight"])
        Traceback (most recent call last):
        ValueError: estimator 'gigpo': parameter 'omega' was renamed; use 'step_weight'
    """
    given = set(given)
    registered = ESTIMATORS.get(name)
    for old, new in (registered.renamed if registered else {}).items():
        if old in given:
            raise ValueError(f"estimator {name!r}: parameter {old!r} was renamed; use {new!r}")
    unknown = sorted(given - set(allowed))
    if unknown:
        raise ValueError(f"estimator {name!r}: unknown parameter(s) {unknown}; allowed: {list(allowed)}")


def register_estimator(
    name: str,
    *,
    params: type[SharedParams],
    episode_only: Mapping[str, object] | None = None,
    renamed: Mapping[str, str] | None = None,
    group_local: bool = True,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register ``fn(batch: StepBatch, params) -> [N] float64 (canonical order)`` under ``name``.

    The decorator returns ``fn`` unchanged; callers use ``ESTIMATORS[name]`` or ``compute_advantages``.

    Args:
        name: registry key.
        params: frozen dataclass extending :class:`SharedParams`; its fields are the accepted keywords.
        episode_only: parameter values that switch the step term off (e.g. ``{"step_weight": 0.0}``); omit
            for an estimator without a step term.
        renamed: old keyword name -> new name (the old one is rejected with an error naming the new one).
        group_local: the result for a task group depends on that group's rows only (evaluate by chunks).

    Raises:
        ValueError: ``name`` is already registered; ``renamed`` does not match the parameters (an old name
            still accepted, or a new name it lacks); ``episode_only`` names an unknown parameter.
        TypeError: ``params`` is not a dataclass extending :class:`SharedParams`.
        Bad values of the defaults or of ``episode_only`` raise what the params dataclass raises.
    """
    episode_only = MappingProxyType(dict(episode_only or {}))
    renamed = MappingProxyType(dict(renamed or {}))

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        if not (
            dataclasses.is_dataclass(params) and isinstance(params, type) and issubclass(params, SharedParams)
        ):
            raise TypeError(
                f"estimator {name!r}: params must be a dataclass extending SharedParams, got {params!r}"
            )
        estimator = Estimator(name, fn, params, episode_only, renamed, group_local)
        allowed = estimator.parameters
        if set(renamed) & set(allowed) or not set(renamed.values()) <= set(allowed):
            raise ValueError(
                f"estimator {name!r}: renamed {dict(renamed)} does not match its parameters {list(allowed)}"
            )
        unknown = sorted(set(episode_only) - set(allowed))
        if unknown:
            raise ValueError(
                f"estimator {name!r}: episode_only names {unknown}, not among its parameters {list(allowed)}"
            )
        params(**episode_only)  # the defaults and the switch are valid values
        ESTIMATORS[name] = estimator
        return fn

    return decorate


def compute_advantages(name: str, batch: Mapping | StepBatch, **params) -> np.ndarray:
    """Compute one advantage per step row with the registered estimator ``name``.

    Args:
        name: one of ``ESTIMATORS`` (``grpo``, ``rloo``, ``dapo``, ``gigpo``, ``g2po``, ``graphgpo``,
            ``progpo``, ``progpo_coverage``).
        batch: column name -> 1-D array, one row per (trajectory, step), rows in any order. Required:
            ``group_id``, ``traj_id``, ``step`` (int64), ``reward`` (float64), ``won``, ``valid`` (bool),
            ``obs_key``, ``action_key`` (uint64 or str/bytes objects); optional ``obs_text`` (str objects) and
            ``admissible_key`` (uint64 key of the state's admissible-action set, for ``state_key``).
        **params: the estimator's parameters: the fields of its params dataclass
            (``ESTIMATORS[name].params``); defaults are the papers'.

    Returns:
        ``[N]`` float64 advantages in the caller's row order.

    Raises:
        ValueError: unknown estimator or parameter, renamed parameter (the message names the new name),
            missing column, mismatched lengths, NaN reward, non-contiguous steps, bad parameter value.

    Example:
        >>> import numpy as np
        >>> batch = {"group_id": np.array([0, 0]), "traj_id": np.array([0, 1]), "step": np.array([0, 0]),
        ...          "reward": np.array([10.0, 0.0]), "won": np.array([True, False]),
        ...          "valid": np.array([True, True]), "obs_key": np.array([1, 1], dtype=np.uint64),
        ...          "action_key": np.array([2, 3], dtype=np.uint64)}
        >>> compute_advantages("grpo", batch, norm="mean").tolist()
        [5.0, -5.0]
    """
    estimator = ESTIMATORS.get(name)
    if estimator is None:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(ESTIMATORS)}")
    return estimator(batch, **params)
