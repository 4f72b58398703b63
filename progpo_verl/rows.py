"""A verl-agent batch as step rows for :func:`training.advantages.compute_advantages`, and back (no verl
import).

verl-agent (``agent_system/multi_turn_rollout/rollout_loop.py``) makes one row per (trajectory, step) and
keeps per row, in ``DataProto.non_tensor_batch`` (numpy object arrays, one entry per row):

==================  =====================================================  ==============================
column              what verl-agent puts there                             step-row column
==================  =====================================================  ==============================
``uid``             the task group (one uuid per ``env.rollout.n`` envs)   ``group_id`` (dense)
``traj_uid``        the trajectory (one uuid per env)                      ``traj_id`` (dense)
``progpo_step``     the step index, tagged by our installer on the rows    ``step``
                    the rollout loop returns, before any reordering
``rewards``         the env's reward of the row's action (raw: the         ``reward``
                    invalid-action penalty is applied to other tensors)
``is_action_valid`` the projection's format check                          ``valid``
``anchor_obs``      the observation without history (GiGPO's anchor)       ``obs_key``, ``obs_text``
``progpo_action``   the projected action text, tagged by our installer     ``action_key``
``episode_rewards`` the trajectory's total reward, on each of its rows     ``won`` on its last row, when
                                                                           it reaches ``won_reward``
==================  =====================================================  ==============================

Row order carries nothing: the trainer's ``_balance_batch`` permutes rows, and the step tag and the ids
identify each row. verl-agent's ``adjust_batch(mode="copy")`` pads the batch to a multiple of the micro-batch
size with copies of random rows; a copy repeats its row's ``(traj_uid, progpo_step)``. How copies enter the
estimator is :class:`Duplicates`:

* ``dedupe`` (default, ours): each (trajectory, step) is one row of the estimator, and a copy takes its row's
  advantage. Group statistics count every env step once, however the batch was padded.
* ``count`` (verl-agent's behaviour): a copy is one more member of every statistic, as in verl-agent, where a
  copy and its row have the same inputs and so the same advantage. Our estimators are defined on trajectories,
  so the copy enters the statistics as a one-step trajectory of its own (its row's state, action and validity,
  its trajectory's success, its trajectory's episode reward ``R`` as reward) and takes its row's advantage.
  Every episode-level statistic (GRPO, GiGPO's episode term, over steps or trajectories) then counts it once
  with its row's score ``R - penalty * invalid``, exactly as verl-agent's estimators do. A step-level
  statistic sees it as a step of return ``R`` where verl-agent's GiGPO uses the row's discounted return
  ``R_t``: the two agree for copies of failed episodes' rows and of last steps (ALFWorld and WebShop reward
  only at the end), and differ by the discount otherwise. An estimator-side row multiplicity would make it
  exact; ``docs/verl_agent.md`` gives the measured difference.

Per-row advantages become verl's token-level ``advantages`` by :func:`token_advantages`: the row's value on
every response token of ``response_mask``, 0 elsewhere (verl-agent's GiGPO and GRPO do the same).

Example:
    >>> import numpy as np
    >>> batch = {
    ...     "uid": np.array(["g", "g", "g", "g"], dtype=object),
    ...     "traj_uid": np.array(["a", "a", "b", "a"], dtype=object),
    ...     "progpo_step": np.array([1, 0, 0, 1], dtype=object),   # the last row is an adjust_batch copy
    ...     "rewards": np.array([10.0, 0.0, 0.0, 10.0], dtype=object),
    ...     "is_action_valid": np.array([True, True, False, True], dtype=object),
    ...     "anchor_obs": np.array(["desk", "room", "room", "desk"], dtype=object),
    ...     "progpo_action": np.array(["take mug", "go to desk", "look", "take mug"], dtype=object),
    ...     "episode_rewards": np.array([10.0, 10.0, 0.0, 10.0], dtype=object),
    ... }
    >>> rows = estimator_rows(batch)
    >>> rows.columns["step"].tolist(), rows.columns["won"].tolist(), rows.source.tolist(), rows.copies
    ([0, 1, 0], [False, True, False], [1, 0, 2, 1], 1)
    >>> counted = estimator_rows(batch, RowOptions(duplicates="count"))  # the copy: a one-step trajectory
    >>> counted.columns["traj_id"].tolist(), counted.source.tolist()
    ([0, 0, 1, 2], [1, 0, 2, 1])
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The step index of each row, tagged by the installer on the rows the rollout loop returns.
STEP_COLUMN = "progpo_step"
#: The projected action text of each row, tagged by the installer (the response decoded and projected).
ACTION_COLUMN = "progpo_action"
#: The verl-agent columns every batch must carry, and ours (tagged by the installer).
BATCH_COLUMNS = ("uid", "traj_uid", "rewards", "is_action_valid", "anchor_obs", "episode_rewards")
TAGGED_COLUMNS = (STEP_COLUMN, ACTION_COLUMN)


class Duplicates(str, enum.Enum):
    """How rows that repeat an earlier (trajectory, step) — ``adjust_batch`` copies — enter the estimator."""

    DEDUPE = "dedupe"
    COUNT = "count"


@dataclasses.dataclass(frozen=True)
class RowOptions:
    """How verl-agent rows become estimator rows.

    Attributes:
        duplicates: ``dedupe`` (each env step once; ours) or ``count`` (a copy is one more row; verl-agent's).
        won_reward: A trajectory whose episode reward reaches this value is a success (verl-agent's ALFWorld
            and WebShop rewards, and ours, are 10 on success and 0 otherwise; rows carry no per-row ``won``).
    """

    duplicates: Duplicates | str = Duplicates.DEDUPE
    won_reward: float = 10.0

    def __post_init__(self):
        try:
            object.__setattr__(self, "duplicates", Duplicates(self.duplicates))
        except ValueError:
            choices = [d.value for d in Duplicates]
            raise ValueError(f"duplicates={self.duplicates!r}: choose one of {choices}") from None
        if not np.isfinite(float(self.won_reward)):
            raise ValueError(f"won_reward={self.won_reward!r} must be a finite number")
        object.__setattr__(self, "won_reward", float(self.won_reward))


@dataclasses.dataclass(frozen=True)
class EstimatorRows:
    """Estimator rows made from a batch.

    Attributes:
        columns: The columns :func:`training.advantages.compute_advantages` takes, ``[M]`` each.
        source: ``[N]`` int64, for each batch row the estimator row whose advantage it takes.
        copies: Batch rows that repeat an earlier row's (trajectory, step).
    """

    columns: dict[str, np.ndarray]
    source: np.ndarray
    copies: int


def to_numpy(values: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like as a numpy array, without importing torch."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def anchor_key(anchor: Any) -> str | bytes:
    """A key with the equality of GiGPO's anchor grouping: texts as they are, arrays by dtype, shape, bytes.

    Raises:
        ValueError: for an anchor of another kind (verl-agent's text envs give text; ``None`` means the env
            manager gave no anchor).
    """
    if isinstance(anchor, str | bytes):
        return anchor
    if isinstance(anchor, np.ndarray):
        return f"{anchor.dtype}|{anchor.shape}|".encode() + np.ascontiguousarray(anchor).tobytes()
    if isinstance(anchor, int | np.integer) and not isinstance(anchor, bool):
        return f"int:{int(anchor)}"
    raise ValueError(
        f"anchor_obs holds a {type(anchor).__name__}; the estimators need text or array anchors "
        "(the env manager's observation 'anchor')"
    )


def step_tags(traj_uid: Any) -> np.ndarray:
    """``[N]`` int64: each row's step in its trajectory, from rows in play order (verl-agent's rollout loop
    returns each trajectory's rows in step order, trajectory after trajectory).

    Example:
        >>> step_tags(np.array(["a", "a", "b", "a"], dtype=object)).tolist()
        [0, 1, 0, 2]
    """
    traj = _dense(to_numpy(traj_uid))
    order = np.argsort(traj, kind="stable")  # rows of a trajectory together, in play order
    sorted_traj = traj[order]
    start = np.flatnonzero(np.r_[True, sorted_traj[1:] != sorted_traj[:-1]])
    rank = np.arange(traj.size) - np.repeat(start, np.diff(np.r_[start, traj.size]))
    steps = np.empty(traj.size, dtype=np.int64)
    steps[order] = rank
    return steps


def _column(batch: Mapping[str, Any], name: str) -> np.ndarray:
    if name not in batch:
        tagged = name in TAGGED_COLUMNS
        hint = " (tagged by progpo_verl.verl_agent.install(); is it installed?)" if tagged else ""
        raise ValueError(f"the batch has no column {name!r}{hint}; it has {sorted(batch)}")
    values = to_numpy(batch[name])
    if values.ndim != 1:
        raise ValueError(f"column {name!r} must be 1-D, got shape {values.shape}")
    return values


def _dense(values: np.ndarray) -> np.ndarray:
    """Dense int64 ids ``0..K-1`` of the distinct values (ids sorted by value, so the same in any process)."""
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(values.astype(str), return_inverse=True)[1].reshape(-1).astype(np.int64)


def estimator_rows(batch: Mapping[str, Any], options: RowOptions | None = None) -> EstimatorRows:
    """The estimator rows of a verl-agent batch (see the module docstring for the mapping).

    Args:
        batch: ``DataProto.non_tensor_batch`` (or any mapping of those columns), ``[N]`` per column, rows in
            any order.
        options: Duplicates and success threshold; defaults as :class:`RowOptions`.

    Raises:
        ValueError: a missing column, mismatched lengths, copies that disagree with their row (a wrong step
            tag), or what :func:`~training.advantages.compute_advantages` rejects later (e.g. steps missing
            from a trajectory: rows dropped by ``adjust_batch(mode="delete")``).
    """
    options = options or RowOptions()
    names = (*BATCH_COLUMNS, *TAGGED_COLUMNS)
    raw = {name: _column(batch, name) for name in names}
    lengths = {name: values.shape[0] for name, values in raw.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns have mismatched lengths: {lengths}")
    group = _dense(raw["uid"])
    traj = _dense(raw["traj_uid"])
    step = raw[STEP_COLUMN].astype(np.int64)
    reward = raw["rewards"].astype(np.float64)
    valid = raw["is_action_valid"].astype(bool)
    episode_reward = raw["episode_rewards"].astype(np.float64)
    obs = np.array([anchor_key(a) for a in raw["anchor_obs"].tolist()], dtype=object)
    action = raw[ACTION_COLUMN].astype(str).astype(object)

    # One estimator row per (trajectory, step): its first batch row; later ones are copies.
    span = int(step.max(initial=0)) + 1
    first, unique_of = np.unique(traj * span + step, return_index=True, return_inverse=True)[1:]
    unique_of = unique_of.reshape(-1)
    is_copy = np.ones(step.shape[0], dtype=bool)
    is_copy[first] = False
    copy_rows = np.flatnonzero(is_copy)
    original = first[unique_of[copy_rows]]
    disagree = (reward[copy_rows] != reward[original]) | (valid[copy_rows] != valid[original])
    if disagree.any():
        row = int(copy_rows[np.flatnonzero(disagree)[0]])
        raise ValueError(
            f"batch row {row} repeats the (traj_uid, {STEP_COLUMN}) of row {int(original[0])} with another "
            "reward or validity: the step tag does not identify rows"
        )

    columns = {
        "group_id": group[first],
        "traj_id": traj[first],
        "step": step[first],
        "reward": reward[first],
        "valid": valid[first],
        "obs_key": obs[first],
        "action_key": action[first],
    }
    last_step = np.zeros(int(traj.max(initial=-1)) + 1, dtype=np.int64)
    np.maximum.at(last_step, columns["traj_id"], columns["step"])
    traj_won = np.zeros(last_step.shape[0], dtype=bool)
    traj_won[traj[first]] = episode_reward[first] >= options.won_reward
    columns["won"] = traj_won[columns["traj_id"]] & (columns["step"] == last_step[columns["traj_id"]])
    source = unique_of.astype(np.int64)

    if options.duplicates is Duplicates.COUNT and copy_rows.size:
        episode_return = np.bincount(columns["traj_id"], weights=columns["reward"], minlength=last_step.size)
        extra = {
            "group_id": group[copy_rows],
            "traj_id": last_step.size + np.arange(copy_rows.size, dtype=np.int64),
            "step": np.zeros(copy_rows.size, dtype=np.int64),
            "reward": episode_return[traj[copy_rows]],
            "valid": valid[copy_rows],
            "obs_key": obs[copy_rows],
            "action_key": action[copy_rows],
            "won": traj_won[traj[copy_rows]],
        }
        columns = {name: np.concatenate([columns[name], extra[name]]) for name in columns}

    if all(isinstance(key, str) for key in columns["obs_key"].tolist()):
        columns["obs_text"] = columns["obs_key"]  # text anchors: GiGPO's similarity and ProGPO's semantics
    return EstimatorRows(columns=columns, source=source, copies=int(copy_rows.size))


def token_advantages(row_advantages: np.ndarray, response_mask: Any) -> Any:
    """verl's token-level advantages: ``[N, L]``, the row's advantage on its response tokens, 0 elsewhere.

    Args:
        row_advantages: ``[N]`` one value per batch row.
        response_mask: ``[N, L]`` 0/1 response-token mask, a torch tensor or a numpy array.

    Returns:
        float32 ``[N, L]`` of the mask's kind (a torch tensor on the mask's device, or a numpy array).

    Example:
        >>> token_advantages(np.array([2.0, -1.0]), np.array([[1, 1, 0], [1, 0, 0]])).tolist()
        [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    """
    values = np.asarray(row_advantages, dtype=np.float32)
    shape = tuple(response_mask.shape)
    if values.ndim != 1 or len(shape) != 2 or shape[0] != values.shape[0]:
        raise ValueError(f"{values.shape[0]} row advantages for a response mask of shape {shape}")
    if hasattr(response_mask, "detach"):  # torch, without importing it where it is not used
        mask = response_mask.float()
        return mask.new_tensor(values).unsqueeze(-1) * mask + 0.0  # + 0.0: no -0.0 off the response
    return values[:, None] * np.asarray(response_mask, dtype=np.float32) + np.float32(0.0)
