"""State keys of the graph estimators (GraphGPO, G2PO): what makes two rows "the same state".

    observation:          key(row) = obs_key                                    [N] uint64 (default)
    observation_actions:  key(row) = mix(obs_key, admissible_key)               [N] uint64

``admissible_key`` is the caller's uint64 key of the *set* of admissible actions in the row's state (order
and repeats ignored; the rollouts use :func:`progpo_envs.core.hashing.action_set_key`). With
``observation_actions``, two rows with equal observation text but different admissible actions are different
states (different graph nodes), which removes one kind of aliasing: identical ALFWorld text after the agent
picked up or processed an object (GiGPO paper App. F.1) usually comes with a different action list. The
GraphGPO reference recipe (``verl-agent/recipe/GraphGPO``, as documented by the Relax reproduction) keys an
ALFWorld state by the observation, a tracker context (location, held item, moved items) and the sorted full
admissible-command list; ``observation_actions`` is that key without the tracker, which needs no
env-specific bookkeeping. The key only refines the partition of ``observation``: it never merges rows that
``observation`` keeps apart.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from training.advantages.batch import StepBatch
from training.advantages.common import combine_keys
from training.advantages.params import parse_enum


class StateKey(str, Enum):
    """The state identity of GraphGPO / G2PO nodes: the observation, or the observation and the set of
    admissible actions (batch column ``admissible_key``)."""

    OBSERVATION = "observation"
    OBSERVATION_ACTIONS = "observation_actions"


def state_keys(batch: StepBatch, state_key: object) -> np.ndarray:
    """``[N]`` uint64 state key of every canonical row.

    Args:
        batch: canonical ``StepBatch`` with N rows.
        state_key: ``"observation"`` or ``"observation_actions"`` (or a :class:`StateKey`).

    Returns:
        ``[N]`` uint64; rows with equal keys (in the same task group) are the same state.

    Raises:
        ValueError: an unknown ``state_key`` (the message lists the choices), or ``observation_actions`` on a
            batch without the ``admissible_key`` column.

    Example:
        >>> b = StepBatch.from_columns(
        ...     {"group_id": np.zeros(2, int), "traj_id": np.array([0, 1]), "step": np.zeros(2, int),
        ...      "reward": np.zeros(2), "won": np.zeros(2, bool), "valid": np.ones(2, bool),
        ...      "obs_key": np.array([7, 7], np.uint64), "action_key": np.array([1, 2], np.uint64),
        ...      "admissible_key": np.array([3, 4], np.uint64)})
        >>> k = state_keys(b, "observation_actions")
        >>> bool(state_keys(b, "observation")[0] == state_keys(b, "observation")[1]), bool(k[0] == k[1])
        (True, False)
    """
    key = parse_enum(StateKey, state_key, "state_key")
    if key is StateKey.OBSERVATION:
        return batch.obs
    if batch.admissible is None:
        raise ValueError(
            "state_key='observation_actions' needs the batch column 'admissible_key' (uint64 key of each "
            "row's set of admissible actions); the batch has none"
        )
    return combine_keys(batch.obs, batch.admissible)
