"""Text spaces for LLM observations and actions.

Gymnasium's :class:`gymnasium.spaces.Text` only contains strings whose every character is in a fixed charset
(alphanumerics by default), so ordinary LLM output and page text ("Nothing happens.", "$12.99", "é") fall
outside it and ``check_env`` fails. :class:`Unicode` keeps ``Text``'s interface (and so its vector batching: a
batched space is a ``Tuple`` of ``Unicode``) but checks only the type and the length. ``sample()`` still draws
alphanumeric strings, which is what ``check_env`` feeds to ``step`` — our envs treat them as invalid actions.
"""

from __future__ import annotations

from typing import Any

from gymnasium.spaces import Text

#: Longest observation any env in this package returns (a WebShop HTML page fits comfortably).
MAX_OBSERVATION_LENGTH = 1 << 20
#: Longest action string an env accepts as a command; longer strings are invalid actions.
MAX_ACTION_LENGTH = 4096


class Unicode(Text):
    """A space of arbitrary unicode strings with a length bound.

    Args:
        max_length: The longest string in the space.
        min_length: The shortest string in the space (0 allows the empty string).
        seed: Seed for :meth:`sample`.

    Example:
        >>> space = Unicode(max_length=32)
        >>> space.contains("Nothing happens. — déjà vu")
        True
        >>> space.contains("x" * 33), space.contains(b"bytes")
        (False, False)
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=min_length, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a ``str`` whose length is within the bounds."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"Unicode({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, Unicode)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )
