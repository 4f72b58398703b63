"""Validation and canonical (group- and trajectory-major) layout of a batch of step rows.

Every estimator works on a :class:`StepBatch`: the caller's columns, validated, converted to fixed dtypes
and reordered so that the rows of one trajectory are adjacent and in step order, and the trajectories of
one task group are adjacent. ``StepBatch.order`` maps
that layout back to the caller's row order, so estimators never see the input order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import xxhash

CHUNK_ROWS = 1 << 16
REQUIRED_COLUMNS = ("group_id", "traj_id", "step", "reward", "won", "valid", "obs_key", "action_key")
OPTIONAL_COLUMNS = ("obs_text", "admissible_key")


def keys_to_uint64(values: np.ndarray, column: str) -> np.ndarray:
    """Map a key column to uint64 digests.

    Args:
        values: ``[N]`` uint64 (or other integer) digests, or str/bytes objects.
        column: column name, used in error messages.

    Returns:
        ``[N]`` uint64. Integer keys are reinterpreted bit-for-bit; str/bytes keys become their xxh3-64
        digest (UTF-8 for str), so equal keys stay equal and the mapping is the same in every process.

    Example:
        >>> k = keys_to_uint64(np.array(["a", "b", "a"], dtype=object), "obs_key")
        >>> k.dtype, bool(k[0] == k[2]), bool(k[0] == k[1])
        (dtype('uint64'), True, False)
    """
    arr = np.asarray(values)
    if arr.dtype == np.uint64:
        return arr
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64).view(np.uint64)
    if arr.dtype.kind in "OUS":
        digest: dict[object, int] = {}
        out = np.empty(arr.shape[0], dtype=np.uint64)
        for i, key in enumerate(arr.tolist()):
            code = digest.get(key)
            if code is None:
                if isinstance(key, str):
                    code = xxhash.xxh3_64_intdigest(key.encode("utf-8"))
                elif isinstance(key, bytes | bytearray):
                    code = xxhash.xxh3_64_intdigest(bytes(key))
                else:
                    raise ValueError(
                        f"column {column!r}: keys must be uint64 or str/bytes, "
                        f"found {type(key).__name__} at row {i}"
                    )
                digest[key] = code
            out[i] = code
        return out
    raise ValueError(f"column {column!r}: keys must be uint64 or str/bytes objects, got dtype {arr.dtype}")


def _int_column(batch: Mapping, name: str) -> np.ndarray:
    arr = np.asarray(batch[name])
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"column {name!r} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _bool_column(batch: Mapping, name: str) -> np.ndarray:
    arr = np.asarray(batch[name])
    if arr.dtype == np.bool_:
        return arr
    if np.issubdtype(arr.dtype, np.integer) and np.isin(arr, (0, 1)).all():
        return arr.astype(bool)
    raise ValueError(f"column {name!r} must be boolean (or 0/1 integers), got dtype {arr.dtype}")


@dataclass(frozen=True)
class StepBatch:
    """Validated step rows in canonical order: rows of a trajectory adjacent with steps ascending,
    trajectories of a task group adjacent, groups in ascending ``group_id``.

    Row arrays have shape ``[N]``, trajectory arrays ``[T]`` (T trajectories), group arrays ``[G]``.
    Group and trajectory indices are dense (``0..G-1``, ``0..T-1``) and independent of the caller's ids.

    Attributes:
        order: ``[N]`` int64, ``order[i]`` = the caller's row index of canonical row ``i``.
        group: ``[N]`` int64 dense task-group index per row.
        traj: ``[N]`` int64 dense trajectory index per row.
        step: ``[N]`` int64 step index inside the trajectory (0..len-1).
        reward: ``[N]`` float64 environment reward of the row's action.
        won: ``[N]`` bool, success reported at this step.
        valid: ``[N]`` bool, the action was well-formed.
        obs: ``[N]`` uint64 observation key (state the action was taken in).
        action: ``[N]`` uint64 action key.
        obs_text: ``[N]`` object array of str, or None when the column was not given.
        admissible: ``[N]`` uint64 key of the set of admissible actions in the row's state (the caller's
            ``admissible_key``, e.g. :func:`progpo_envs.core.hashing.action_set_key`), or None when the column
            was not given.
        traj_start: ``[T]`` int64 first canonical row of each trajectory.
        traj_len: ``[T]`` int64 number of rows (steps) of each trajectory.
        traj_group: ``[T]`` int64 dense group of each trajectory.
        n_groups: number of task groups G.
    """

    order: np.ndarray
    group: np.ndarray
    traj: np.ndarray
    step: np.ndarray
    reward: np.ndarray
    won: np.ndarray
    valid: np.ndarray
    obs: np.ndarray
    action: np.ndarray
    obs_text: np.ndarray | None
    admissible: np.ndarray | None
    traj_start: np.ndarray
    traj_len: np.ndarray
    traj_group: np.ndarray
    n_groups: int

    @property
    def n_rows(self) -> int:
        return int(self.order.shape[0])

    @property
    def n_traj(self) -> int:
        return int(self.traj_start.shape[0])

    @cached_property
    def chunk_bounds(self) -> np.ndarray:
        """Row offsets ``[C+1]``: chunks of at least ``CHUNK_ROWS`` rows (or the rest) cut at task-group
        boundaries (rows of a group are contiguous); see :meth:`rows`."""
        first_traj = np.flatnonzero(np.r_[True, self.traj_group[1:] != self.traj_group[:-1]])
        group_start = self.traj_start[first_traj]
        idx = np.searchsorted(group_start, np.arange(0, self.n_rows, CHUNK_ROWS))
        return np.unique(np.r_[group_start[idx[idx < group_start.size]], 0, self.n_rows])

    def rows(self, lo: int, hi: int) -> StepBatch:
        """The canonical rows ``lo:hi`` as a batch of their own; ``lo`` and ``hi`` must be task-group
        boundaries (e.g. consecutive ``chunk_bounds``). Indices are re-based; ``order`` keeps the caller's."""
        t0, t1 = int(self.traj[lo]), int(self.traj[hi - 1]) + 1
        g0 = int(self.group[lo])
        return StepBatch(
            order=self.order[lo:hi],
            group=self.group[lo:hi] - g0,
            traj=self.traj[lo:hi] - t0,
            step=self.step[lo:hi],
            reward=self.reward[lo:hi],
            won=self.won[lo:hi],
            valid=self.valid[lo:hi],
            obs=self.obs[lo:hi],
            action=self.action[lo:hi],
            obs_text=None if self.obs_text is None else self.obs_text[lo:hi],
            admissible=None if self.admissible is None else self.admissible[lo:hi],
            traj_start=self.traj_start[t0:t1] - lo,
            traj_len=self.traj_len[t0:t1],
            traj_group=self.traj_group[t0:t1] - g0,
            n_groups=int(self.group[hi - 1]) + 1 - g0,
        )

    @cached_property
    def is_last(self) -> np.ndarray:
        """``[N]`` bool: the row is its trajectory's final step."""
        return self.step == self.traj_len[self.traj] - 1

    @cached_property
    def episode_return(self) -> np.ndarray:
        """``[T]`` float64: sum of the trajectory's rewards (the episode reward R)."""
        return np.bincount(self.traj, weights=self.reward, minlength=self.n_traj)

    @cached_property
    def traj_won(self) -> np.ndarray:
        """``[T]`` bool: the environment reported success at some step of the trajectory."""
        return np.bincount(self.traj, weights=self.won, minlength=self.n_traj) > 0

    @cached_property
    def group_u64(self) -> np.ndarray:
        """``[N]`` uint64 tag of the row's group, used to scope hashed keys to a task group."""
        return (self.group.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)

    def rows_at_step(self, s: int) -> np.ndarray:
        """Canonical indices of the step-``s`` rows of every trajectory that is longer than ``s``."""
        return self.traj_start[self.traj_len > s] + s

    def unsort(self, values: np.ndarray) -> np.ndarray:
        """Return canonical-order ``[N]`` values in the caller's row order."""
        out = np.empty_like(values)
        out[self.order] = values
        return out

    @classmethod
    def from_columns(cls, batch: Mapping) -> StepBatch:
        """Validate ``batch`` (column name -> 1-D array) and build the canonical layout.

        Raises:
            ValueError: missing column, mismatched lengths, wrong dtype, non-finite reward, a trajectory
                whose steps are not exactly ``0..len-1``, or a trajectory spanning several groups.
        """
        if isinstance(batch, StepBatch):
            return batch
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a mapping of column name -> array, got {type(batch).__name__}")
        missing = [c for c in REQUIRED_COLUMNS if c not in batch]
        if missing:
            raise ValueError(
                f"batch is missing required column(s) {missing}; required: {list(REQUIRED_COLUMNS)}"
            )
        lengths = {
            c: len(np.asarray(batch[c]))
            for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
            if batch.get(c) is not None
        }
        for c in lengths:
            if np.asarray(batch[c]).ndim != 1:
                raise ValueError(f"column {c!r} must be 1-D, got shape {np.asarray(batch[c]).shape}")
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns have mismatched lengths: {lengths}")

        group_id = _int_column(batch, "group_id")
        traj_id = _int_column(batch, "traj_id")
        step = _int_column(batch, "step")
        reward = np.asarray(batch["reward"])
        if not (np.issubdtype(reward.dtype, np.floating) or np.issubdtype(reward.dtype, np.integer)):
            raise ValueError(f"column 'reward' must be numeric, got dtype {reward.dtype}")
        reward = reward.astype(np.float64, copy=False)
        bad = ~np.isfinite(reward)
        if bad.any():
            rows = np.flatnonzero(bad)[:5].tolist()
            kind = "NaN" if np.isnan(reward).any() else "non-finite"
            raise ValueError(f"column 'reward' contains {kind} values (rows {rows})")
        won = _bool_column(batch, "won")
        valid = _bool_column(batch, "valid")
        obs = keys_to_uint64(batch["obs_key"], "obs_key")
        action = keys_to_uint64(batch["action_key"], "action_key")
        obs_text = None
        if "obs_text" in batch and batch["obs_text"] is not None:
            obs_text = np.asarray(batch["obs_text"], dtype=object)
        admissible = None
        if "admissible_key" in batch and batch["admissible_key"] is not None:
            admissible = keys_to_uint64(batch["admissible_key"], "admissible_key")

        n = group_id.shape[0]
        if n and step.min() < 0:
            raise ValueError("column 'step' has negative values")
        order = _trajectory_major_order(traj_id, step)
        traj_sorted, step_sorted, group_sorted = traj_id[order], step[order], group_id[order]

        new_traj = np.ones(n, dtype=bool)
        new_traj[1:] = traj_sorted[1:] != traj_sorted[:-1]
        traj_start = np.flatnonzero(new_traj)
        traj = np.cumsum(new_traj) - 1
        traj_len = np.diff(np.append(traj_start, n))
        expected_step = np.arange(n) - traj_start[traj]
        broken = step_sorted != expected_step
        if broken.any():
            t = traj_sorted[np.flatnonzero(broken)[0]]
            steps = np.sort(step[traj_id == t])[:20].tolist()
            raise ValueError(
                f"column 'step': trajectory traj_id={t} must have contiguous steps 0..len-1 "
                f"without duplicates, got {steps}"
            )
        mixed = group_sorted != group_sorted[traj_start][traj]
        if mixed.any():
            t = traj_sorted[np.flatnonzero(mixed)[0]]
            raise ValueError(f"column 'group_id': trajectory traj_id={t} spans several group_id values")
        uniq_groups, traj_group = np.unique(group_sorted[traj_start], return_inverse=True)
        traj_group = traj_group.reshape(-1)

        # Put the trajectories of a task group next to each other, so that group-scoped work can run on
        # cache-sized chunks of rows (see ``chunk_bounds``).
        by_group = np.argsort(traj_group, kind="stable")
        if np.any(by_group != np.arange(by_group.size)):
            order = order[expand_ranges(traj_start[by_group], traj_start[by_group] + traj_len[by_group])]
            traj_len, traj_group = traj_len[by_group], traj_group[by_group]
            traj_start = np.cumsum(traj_len) - traj_len
            traj = np.repeat(np.arange(traj_len.size), traj_len)
            step_sorted = np.arange(n) - traj_start[traj]

        return cls(
            order=order,
            group=traj_group[traj].astype(np.int64),
            traj=traj.astype(np.int64),
            step=step_sorted,
            reward=reward[order],
            won=won[order],
            valid=valid[order],
            obs=obs[order],
            action=action[order],
            obs_text=None if obs_text is None else obs_text[order],
            admissible=None if admissible is None else admissible[order],
            traj_start=traj_start.astype(np.int64),
            traj_len=traj_len.astype(np.int64),
            traj_group=traj_group.astype(np.int64),
            n_groups=int(uniq_groups.size),
        )


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for every pair, vectorised."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.arange(total) - np.repeat(offsets, lengths) + np.repeat(starts, lengths)


def _trajectory_major_order(traj_id: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Permutation that puts rows of a trajectory together in step order.

    Fast path (no sort): rows already come in trajectory blocks with ascending steps, whatever the order of
    the blocks, as a rollout writer produces them. Otherwise a lexsort on (traj_id, step).
    """
    n = traj_id.shape[0]
    if n == 0:
        return np.arange(0, dtype=np.int64)
    same = traj_id[1:] == traj_id[:-1]
    in_blocks = np.all(~same | (step[1:] == step[:-1] + 1)) and np.all(step[1:][~same] == 0) and step[0] == 0
    if in_blocks and np.unique(traj_id[np.flatnonzero(np.r_[True, ~same])]).size == int((~same).sum()) + 1:
        return np.arange(n, dtype=np.int64)
    return np.lexsort((step, traj_id)).astype(np.int64)
