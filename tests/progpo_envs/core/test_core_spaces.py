"""The Unicode text space."""

from __future__ import annotations

from gymnasium.spaces import Text, Tuple
from gymnasium.vector.utils import batch_space

from progpo_envs.core.spaces import Unicode


def test_contains_any_unicode_within_length():
    space = Unicode(max_length=10)
    assert space.contains("déjà vu ✓")
    assert space.contains("")  # min_length defaults to 0
    assert not space.contains("x" * 11)
    assert not space.contains(b"bytes") and not space.contains(3) and not space.contains(None)
    assert not Text(max_length=10).contains("déjà vu ✓")  # why Unicode exists


def test_min_length_and_equality():
    space = Unicode(max_length=5, min_length=1)
    assert not space.contains("") and space.contains("a")
    assert space == Unicode(max_length=5, min_length=1)
    assert space != Unicode(max_length=5) and space != Text(max_length=5, min_length=1)
    assert repr(space) == "Unicode(1, 5)"


def test_samples_are_contained_and_seeded():
    a, b = Unicode(max_length=20, min_length=1, seed=3), Unicode(max_length=20, min_length=1, seed=3)
    samples = [a.sample() for _ in range(20)]
    assert samples == [b.sample() for _ in range(20)]
    assert all(a.contains(s) for s in samples)


def test_batched_space_is_a_tuple_of_unicode():
    batched = batch_space(Unicode(max_length=8), 3)
    assert isinstance(batched, Tuple) and all(isinstance(s, Unicode) for s in batched.spaces)
    assert batched.contains(("a", "é", ""))
