"""Seeds derived from the run's seed and a purpose: stable across processes and machines.

Example:
    >>> derive_seed(0, "tasks", 3) == derive_seed(0, "tasks", 3)
    True
    >>> derive_seed(0, "tasks", 3) == derive_seed(1, "tasks", 3)
    False
"""

from __future__ import annotations

from progpo_envs.core.hashing import text_digest


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts``: xxh3 of their text (Python's ``hash`` is salted per process)."""
    return int(text_digest("/".join(str(p) for p in parts))) & ((1 << 63) - 1)
