"""Estimator registry: ``ESTIMATORS`` (name -> function) and ``compute_advantages`` (the only entry point
the training loop uses).

Adding an estimator = one module with a function decorated by ``@register_estimator("name")`` (imported in
``training/advantages/__init__.py``) plus its tests. The decorated function receives a validated canonical
:class:`StepBatch` and keyword-only parameters; the registered wrapper accepts a plain column mapping,
rejects unknown parameters with ``ValueError`` and returns advantages in the caller's row order. A
parameter that was renamed (``RENAMED_PARAMETERS``) is rejected with an error naming its new name.

Every estimator of the papers is *group-local*: rows of different task groups never interact. The wrapper
therefore evaluates it on chunks of whole task groups of about ``CHUNK_ROWS`` (64k) rows, so the working
set stays in cache and the cost is linear in rows. An estimator that needs batch-wide statistics registers
with ``group_local=False`` and sees the whole batch at once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from training.advantages.batch import StepBatch

EstimatorFn = Callable[..., np.ndarray]
ESTIMATORS: dict[str, EstimatorFn] = {}

#: Renamed keyword parameters, estimator -> {old name: new name}. One name per concept: the weight of the
#: step-level advantage against the episode advantage is ``step_weight`` everywhere (GiGPO's and ProGPO's
#: omega, G2PO's ``step_advantage_w``); GraphGPO's omega is a different quantity, the per-step discount
#: of its distance-to-success reward, hence ``distance_discount``. An old name raises an error naming the new.
RENAMED_PARAMETERS: dict[str, dict[str, str]] = {
    "gigpo": {"omega": "step_weight"},
    "g2po": {"step_advantage_w": "step_weight"},
    "progpo": {"omega": "step_weight"},
    "progpo_coverage": {"omega": "step_weight"},
    "graphgpo": {"omega": "distance_discount"},
}


def check_parameter_names(name: str, given: Iterable[str], allowed: Sequence[str]) -> None:
    """Reject parameter names that estimator ``name`` does not accept, naming the new name of a renamed one.

    Args:
        name: registry key of the estimator.
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
    for old, new in RENAMED_PARAMETERS.get(name, {}).items():
        if old in given:
            raise ValueError(f"estimator {name!r}: parameter {old!r} was renamed; use {new!r}")
    unknown = sorted(given - set(allowed))
    if unknown:
        raise ValueError(f"estimator {name!r}: unknown parameter(s) {unknown}; allowed: {list(allowed)}")


def register_estimator(name: str, *, group_local: bool = True) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register ``fn(batch: StepBatch, *, **params) -> [N] float64 (canonical order)`` under ``name``.

    Args:
        name: registry key.
        group_local: the result for a task group depends on that group's rows only (evaluate by chunks).

    Raises:
        ValueError: ``name`` is already registered, or its ``RENAMED_PARAMETERS`` entry does not match its
            parameters (an old name still accepted, or a new name it lacks).
    """

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        params = inspect.signature(fn).parameters
        allowed = tuple(p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY)
        renamed = RENAMED_PARAMETERS.get(name, {})
        if set(renamed) & set(allowed) or not set(renamed.values()) <= set(allowed):
            raise ValueError(f"estimator {name!r}: RENAMED_PARAMETERS {renamed} do not match {list(allowed)}")

        @functools.wraps(fn)
        def estimator(batch: Mapping | StepBatch, **kwargs) -> np.ndarray:
            check_parameter_names(name, kwargs, allowed)
            steps = StepBatch.from_columns(batch)
            if steps.n_rows == 0:
                return np.zeros(0, dtype=np.float64)
            bounds = steps.chunk_bounds if group_local else np.array([0, steps.n_rows])
            if bounds.size == 2:
                adv = np.asarray(fn(steps, **kwargs), dtype=np.float64)
            else:
                parts = [
                    fn(steps.rows(lo, hi), **kwargs) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
                ]
                adv = np.concatenate(parts).astype(np.float64, copy=False)
            return steps.unsort(adv)

        estimator.parameters = allowed  # accepted keyword names, for callers that validate configs early
        ESTIMATORS[name] = estimator
        return estimator

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
        **params: the estimator's keyword parameters (see its docstring); defaults are the papers'.

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
    fn = ESTIMATORS.get(name)
    if fn is None:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(ESTIMATORS)}")
    return fn(batch, **params)
