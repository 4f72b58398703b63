"""Seeds derived from the run's seed and a purpose: stable across processes and machines.

Example:
    >>> derive_seed(0, "tasks", 3) == derive_seed(0, "tasks", 3)
    True
    >>> derive_seed(0, "tasks", 3) == derive_seed(1, "tasks", 3)
    False
    >>> request_seed(7, traj_id=2, step=0) != request_seed(7, traj_id=2, step=1)
    True
"""

from __future__ import annotations

from progpo_envs.core.hashing import text_digest


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts``: xxh3 of their text (Python's ``hash`` is salted per process)."""
    return int(text_digest("/".join(str(p) for p in parts))) & ((1 << 63) - 1)


def request_seed(sampling_seed: int, traj_id: int, step: int) -> int:
    """The sampling seed of trajectory ``traj_id``'s response at step ``step`` of a rollout sampled from
    ``sampling_seed``: each response is drawn from its own seed (:mod:`training.decoding`), so it is the same
    whether the episodes run in lock step or each at its own pace, and on any number of processes."""
    return derive_seed(sampling_seed, traj_id, step)
