"""The JSON codec returns exactly the values the env produced (types included)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo_envs.core.history import HistoryTracker
from progpo_envs.server.codec import CodecError, decode, dumps, encode, loads
from tests.progpo_envs.server.hosting_helpers import same


def test_history_keys_round_trip_exactly():
    tracker = HistoryTracker("pick-1", depths=(1, 2, 5))
    tracker.reset("You are in a room.")
    info = {
        **tracker.step("go to desk 1", "You arrive at desk 1."),
        "admissible_actions": ["look"],
        "won": False,
    }
    back = loads(dumps(info))
    assert same(back, info)
    assert type(back["obs_hash"]) is np.uint64 and all(type(k) is int for k in back["history_keys"])


def test_extreme_values():
    value = {
        "max": np.uint64(2**64 - 1),
        "neg": np.int64(-(2**63)),
        "nan": float("nan"),
        "inf": -math.inf,
        "f32": np.float32(1.5),
        "b": np.bool_(True),
        "arr": np.arange(6, dtype=np.uint64).reshape(2, 3),
        "objarr": np.array(["a", None], dtype=object),
        "bytes": b"\x00\xff",
        "$weird": 1,
        3: (1, [2]),
    }
    assert same(loads(dumps(value)), value)
    json.loads(dumps(value))  # strict JSON: no NaN literals


@pytest.mark.parametrize(
    "bad",
    [
        {"$np": "<u8"},
        {"$np": 5, "v": 1},
        {"$np": "<V8", "v": 1},
        {"$nd": "<u8", "shape": [3], "v": [1]},
        {"$dict": [[1]]},
        {"$dict": [[[1], 2]]},
        {"$unknown": 1},
        {"$float": "x"},
        {"$bytes": "!!"},
        {"$tuple": 3},
    ],
)
def test_malformed_payloads_are_codec_errors(bad):
    with pytest.raises(CodecError):
        decode(bad)


def test_unencodable_values_are_rejected():
    with pytest.raises(CodecError):
        encode({"x": object()})


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
)
_key = st.one_of(st.text(max_size=8), st.integers(-5, 5))
_values = st.recursive(
    _leaf,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.tuples(kids, kids), st.dictionaries(_key, kids, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_any_info_round_trips(value):
    assert same(loads(dumps(value)), value)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
        lambda kids: st.one_of(
            st.lists(kids, max_size=3),
            st.dictionaries(
                st.sampled_from(["$np", "$nd", "$dict", "v", "shape", "$tuple", "$float", "a"]),
                kids,
                max_size=3,
            ),
        ),
        max_leaves=10,
    )
)
def test_decoding_junk_raises_only_codec_errors(data):
    try:
        decode(data)
    except CodecError:
        pass
