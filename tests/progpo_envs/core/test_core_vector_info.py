"""Per-copy infos: the shortcut past batching gives exactly what batching and unbatching give."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import VectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo_envs.core.vector import GroupVectorEnv, reset_per_copy, step_per_copy
from progpo_envs.core.vector_info import unbatch_copy_infos, unbatch_info
from progpo_envs.testing import COUNTER_ENV_ID


def gymnasium_batch(infos: list[dict]) -> dict:
    """Gymnasium's own batching: ``VectorEnv._add_info`` folded over the copies."""
    envs = VectorEnv()
    envs.num_envs = len(infos)
    merged: dict = {}
    for i, info in enumerate(infos):
        merged = envs._add_info(merged, info, i)
    return merged


def assert_identical(got, want, path="info") -> None:
    """Equal, with the same types and (for dicts) the same key order, all the way down."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_identical(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_identical(a, b, f"{path}[{i}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want), path
    elif isinstance(want, float) and want != want:  # NaN (a None cast into a float column)
        assert got != got, path
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def check(infos: list[dict]) -> None:
    try:
        want = unbatch_info(gymnasium_batch(infos), len(infos))
    except (TypeError, ValueError, OverflowError):  # what batching rejects, the shortcut must reject too
        # (not necessarily with the same error: batching goes copy by copy, the shortcut key by key)
        with pytest.raises((TypeError, ValueError, OverflowError)):
            unbatch_copy_infos(infos, gymnasium_batch)
        return
    assert_identical(unbatch_copy_infos(infos, gymnasium_batch), want)


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=False, width=64),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.integers(-128, 127).map(np.int8),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(np.float32),
    st.booleans().map(np.bool_),
    st.text(max_size=4),
    st.none(),
    st.lists(st.text(max_size=3), max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.lists(st.floats(allow_nan=False, width=32), min_size=3, max_size=3).map(np.array),
)
nested = st.dictionaries(st.one_of(st.integers(1, 3), st.sampled_from(["a", "b"])), scalars, max_size=3)
keys = st.sampled_from(["won", "score", "hash", "text", "actions", "final_obs", "x", "y", "group_id"])
infos_strategy = st.lists(
    st.dictionaries(keys, scalars, max_size=6).flatmap(
        lambda base: st.dictionaries(st.sampled_from(["history_keys", "page"]), nested, max_size=2).map(
            lambda sub: {**base, **sub}
        )
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # as batching warns
@settings(max_examples=300, deadline=None)
@given(infos_strategy)
def test_shortcut_equals_batching_then_unbatching(infos):
    check(infos)


@pytest.mark.parametrize(
    "infos",
    [
        [{"score": 1}, {"score": 2.7}, {"score": True}],  # a column typed by its first value casts the rest
        [{"won": np.bool_(True)}, {"won": False}],  # numpy bools are objects to Gymnasium
        [{"hash": np.uint64(2**64 - 1)}, {"hash": 5}],
        [{"history_keys": {1: np.uint64(3), 2: np.uint64(4)}}, {"history_keys": {}}, {}],  # {} is left out
        [{"final_obs": "end", "actions": ["a"]}, {"final_obs": ["x"], "actions": ("b",)}],
        [{"vec": np.zeros(2)}, {"vec": [1, 2]}],
        [{"x": 1, "_x": 2}, {"x": 3}],  # irregular: a key named like a mask
        [{"x": {"a": 1}}, {"x": 2}],  # irregular: a dict in one copy, a value in another
        [{"score": 2**70}],  # batching raises, and so must the shortcut
        [{"_private": 1}],
        [{1: 5, "1": 6}, {1: 7}],  # irregular: two keys with one mask name
    ],
)
def test_shortcut_equals_batching_then_unbatching_on_edge_cases(infos):
    check(infos)


def test_unbatch_info_takes_integer_keys():
    """``history_keys`` maps depths (ints) to keys; unbatching used to assume every key is a string."""
    infos = [{"history_keys": {1: np.uint64(7), 2: np.uint64(8)}}, {"history_keys": {1: np.uint64(9)}}]
    expected = [{"history_keys": {1: 7, 2: 8}}, {"history_keys": {1: 9}}]
    assert unbatch_info(gymnasium_batch(infos), 2) == expected


TOY_ID = COUNTER_ENV_ID


class Batched(gym.vector.VectorWrapper):
    """A vector env that is not a GroupVectorEnv: it only hands out batched infos."""


def test_group_vector_env_per_copy_infos_equal_its_batched_infos_taken_apart():
    """``reset_copies``/``step_copies`` (and the per-copy helpers, on any vector env) agree with batching."""
    actions = [["inc", "dec", "look", "inc"], ["inc", "inc", "", "inc"], ["inc"] * 4]
    runs = []
    for per_copy in (True, False):
        envs = gym.make_vec(TOY_ID, num_envs=4, group_size=2, history_depths=(1, 2), max_steps=3)
        try:
            assert isinstance(envs, GroupVectorEnv)
            if per_copy:
                run = [envs.reset_copies(seed=5)[1]] + [envs.step_copies(a)[4] for a in actions]
            else:
                _, info = envs.reset(seed=5)
                run = [unbatch_info(info, 4)] + [unbatch_info(envs.step(a)[4], 4) for a in actions]
        finally:
            envs.close()
        runs.append(run)
    assert_identical(runs[0], runs[1])
    assert isinstance(runs[0][1][0]["history_keys"][1], int)  # numpy keys come out as Python ints
    for wrap in (lambda envs: envs, Batched):
        envs = wrap(gym.make_vec(TOY_ID, num_envs=4, group_size=2, history_depths=(1, 2), max_steps=3))
        try:
            run = [reset_per_copy(envs, seed=5)[1]] + [step_per_copy(envs, a)[4] for a in actions]
        finally:
            envs.close()
        assert_identical(run, runs[1])
