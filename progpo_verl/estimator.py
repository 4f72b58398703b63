"""One of our estimators with validated parameters, applied to a verl-agent batch.

:func:`estimator_spec` checks the parameters when the trainer is built (names with
:func:`training.advantages.registry.check_parameter_names` against the keys ``progpo train`` accepts,
:func:`training.config.algo_parameters`; values by running the estimator once on a two-trajectory batch), so
a typo fails before any GPU worker starts. :meth:`EstimatorSpec.row_advantages` then maps a batch to
estimator rows (:func:`progpo_verl.rows.estimator_rows`), calls
:func:`training.advantages.compute_advantages` and gives each batch row its advantage.

Example:
    >>> import numpy as np
    >>> spec = estimator_spec("grpo", {"norm": "mean"}, invalid_penalty=0.0)
    >>> batch = {
    ...     "uid": np.array(["g", "g"], dtype=object), "traj_uid": np.array(["a", "b"], dtype=object),
    ...     "progpo_step": np.array([0, 0]), "rewards": np.array([10.0, 0.0]),
    ...     "is_action_valid": np.array([True, True]), "anchor_obs": np.array(["room", "room"], dtype=object),
    ...     "progpo_action": np.array(["look", "go"], dtype=object), "episode_rewards": np.array([10.0, 0.0]),
    ... }
    >>> spec.row_advantages(batch).tolist()
    [5.0, -5.0]
    >>> estimator_spec("grpo", {"nrom": "mean"}, invalid_penalty=0.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: estimator 'grpo': unknown parameter(s) ['nrom']; allowed: [...]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from progpo_verl.rows import RowOptions, estimator_rows
from training.advantages import ESTIMATORS, compute_advantages
from training.advantages.registry import check_parameter_names
from training.config import algo_parameters


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """An estimator of :mod:`training.advantages` with checked parameters.

    Attributes:
        estimator: Its registry name (``progpo``, ``gigpo``, ...).
        params: Its keyword parameters (``invalid_penalty`` aside).
        invalid_penalty: Subtracted by the estimator from an invalid row's score and step target.
        rows: How batch rows become estimator rows.
    """

    estimator: str
    params: Mapping[str, Any]
    invalid_penalty: float
    rows: RowOptions

    def row_advantages(self, batch: Mapping[str, Any]) -> np.ndarray:
        """``[N]`` float64: the advantage of each row of ``batch`` (a ``non_tensor_batch``), in its order."""
        rows = estimator_rows(batch, self.rows)
        advantages = compute_advantages(
            self.estimator, rows.columns, invalid_penalty=self.invalid_penalty, **self.params
        )
        return advantages[rows.source]


def _probe_batch() -> dict[str, np.ndarray]:
    """Two trajectories of two steps in one group, one won: enough for every estimator to use its values."""
    return {
        "group_id": np.zeros(4, dtype=np.int64),
        "traj_id": np.array([0, 0, 1, 1]),
        "step": np.array([0, 1, 0, 1]),
        "reward": np.array([0.0, 10.0, 0.0, 0.0]),
        "won": np.array([False, True, False, False]),
        "valid": np.array([True, True, True, False]),
        "obs_key": np.array(["room", "desk", "room", "room"], dtype=object),
        "action_key": np.array(["go to desk", "take mug", "look", "look"], dtype=object),
        "obs_text": np.array(["room", "desk", "room", "room"], dtype=object),
    }


def estimator_spec(
    estimator: str, params: Mapping[str, Any], *, invalid_penalty: float, rows: RowOptions | None = None
) -> EstimatorSpec:
    """Check ``params`` for ``estimator`` and return the spec.

    Raises:
        ValueError: an unknown estimator, an unknown or renamed parameter (the message names the new name), or
            a bad value (the estimator's own message).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; registered: {sorted(ESTIMATORS)}")
    params = dict(params)
    check_parameter_names(estimator, params, algo_parameters(estimator))
    try:
        compute_advantages(estimator, _probe_batch(), invalid_penalty=invalid_penalty, **params)
    except ValueError as error:
        raise ValueError(f"estimator {estimator!r} with {params}: {error}") from error
    return EstimatorSpec(estimator, MappingProxyType(params), float(invalid_penalty), rows or RowOptions())
