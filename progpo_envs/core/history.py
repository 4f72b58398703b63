"""History keys: exact-prefix and last-k-window keys of a text episode, maintained incrementally.

For an episode of task ``τ`` with observations ``o_0, o_1, ...`` and actions ``a_0, a_1, ...``, at step ``t``
(after ``t`` actions, looking at ``o_t``):

* ``obs_hash``    = D(o_t)  — the raw current observation only (no prompt, no history);
* ``history_key`` = P(C_t, D(o_t)), the exact prefix: task + every (observation, action) pair so far +
  ``o_t``, where the chain is ``C_0 = T(τ)`` and ``C_{i+1} = H(C_i, D(o_i), D(a_i))`` — one hash per step, not
  a re-hash of the whole history;
* ``history_keys[k]`` = the same construction over only the last ``k`` pairs. While ``t ≤ k`` the window holds
  the whole history and the key **equals** ``history_key``; once pairs have fallen out of the window the fold
  starts from a window seed ``W(τ, k)`` instead of ``T(τ)``, so a window key never collides with a full-prefix
  key. Cost per step is O(k).

``D`` is :func:`~progpo_envs.core.hashing.text_digest`; ``H``, ``P``, ``T``, ``W`` are
:func:`~progpo_envs.core.hashing.combine` under distinct roles.

Example:
    >>> tracker = HistoryTracker(task_id="pick-1", depths=(1,))
    >>> keys0 = tracker.reset("You are in a room.")
    >>> keys1 = tracker.step("go to desk 1", "You arrive at desk 1.")
    >>> # one pair so far: the window is the whole history
    >>> bool(keys1["history_keys"][1] == keys1["history_key"])
    True
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from progpo_envs.core.hashing import KeyRole, combine, text_digest


class HistoryTracker:
    """Incrementally computes ``obs_hash``, ``history_key`` and per-depth ``history_keys``.

    Args:
        task_id: Identifies the task; part of every history key.
        depths: History depths ``k`` (each ≥ 1) for which ``history_keys[k]`` is reported.
    """

    def __init__(self, task_id: str = "", depths: Sequence[int] = ()):
        if any(int(k) < 1 for k in depths):
            raise ValueError(f"history depths must be >= 1, got {tuple(depths)}")
        self.depths = tuple(sorted({int(k) for k in depths}))
        self._max_depth = self.depths[-1] if self.depths else 0
        self.set_task(task_id)

    def set_task(self, task_id: str) -> None:
        """Change the task whose keys are computed (takes effect at the next :meth:`reset`)."""
        self.task_id = task_id
        self._task_key = text_digest(f"task:{task_id}")
        self._window_seeds = {k: combine(KeyRole.WINDOW, self._task_key, k) for k in self.depths}

    def reset(self, observation: str) -> dict:
        """Start a new episode at ``observation``; returns its keys."""
        self._chain = self._task_key
        self._pairs: deque[tuple[np.uint64, np.uint64]] = deque(maxlen=self._max_depth or None)
        self._num_pairs = 0
        self._obs_key = text_digest(observation)
        return self.keys()

    def step(self, action: str, observation: str) -> dict:
        """Record ``action`` taken in the current observation and move to ``observation``; returns its
        keys."""
        action_key = text_digest(action)
        self._chain = combine(KeyRole.CHAIN, self._chain, self._obs_key, action_key)
        if self._max_depth:
            self._pairs.append((self._obs_key, action_key))
        self._num_pairs += 1
        self._obs_key = text_digest(observation)
        return self.keys()

    def keys(self) -> dict:
        """``{"obs_hash", "history_key"[, "history_keys": {k: key}]}`` for the current step (numpy uint64)."""
        history_key = combine(KeyRole.PREFIX, self._chain, self._obs_key)
        out = {"obs_hash": self._obs_key, "history_key": history_key}
        if self.depths:
            out["history_keys"] = {k: self._window_key(k, history_key) for k in self.depths}
        return out

    def _window_key(self, depth: int, history_key: np.uint64) -> np.uint64:
        if self._num_pairs <= depth:
            return history_key
        chain = self._window_seeds[depth]
        for obs_key, action_key in list(self._pairs)[-depth:]:
            chain = combine(KeyRole.CHAIN, chain, obs_key, action_key)
        return combine(KeyRole.PREFIX, chain, self._obs_key)
