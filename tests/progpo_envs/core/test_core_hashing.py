"""Deterministic content hashing: normalisation, fixed digests, identity across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from progpo_envs.core.hashing import (
    KeyRole,
    action_set_key,
    combine,
    hex_key,
    normalize_text,
    text_digest,
)

SAMPLES = [
    "look",
    "You arrive at drawer 1.",
    "Nothing happens. — déjà vu",
    "",
    "  a\tb\n\nc  ",
    "\u00a0x\u2003y",
]


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("  go to   desk 1\n", "go to desk 1"),
        ("a\tb\r\nc", "a b c"),
        ("nbsp\u00a0and\u2003em space", "nbsp and em space"),
        ("cafe\u0301", "caf\u00e9"),  # decomposed é → composed (NFC)
        ("Open Drawer 1", "Open Drawer 1"),  # case is kept
        ("   ", ""),
    ],
)
def test_normalize_text(text, normalized):
    assert normalize_text(text) == normalized


def test_digest_ignores_whitespace_layout_but_not_case_or_punctuation():
    assert text_digest("You arrive at  drawer 1.\n") == text_digest("You arrive at drawer 1.")
    assert text_digest("cafe\u0301") == text_digest("caf\u00e9")
    assert text_digest("open drawer 1") != text_digest("Open drawer 1")
    assert text_digest("open drawer 1") != text_digest("open drawer 1.")


def test_digest_is_the_documented_xxh3_value():
    # Fixed by the algorithm (xxh3-64, seed 0, UTF-8 of the normalised text), not by the process.
    assert hex_key(text_digest("look")) == "983396b5f3351616"
    assert isinstance(text_digest("look"), np.uint64)


def test_hex_key_is_16_lowercase_hex_digits():
    for text in SAMPLES:
        key = hex_key(text_digest(text))
        assert len(key) == 16 and key == key.lower() and int(key, 16) == int(text_digest(text))


def test_combine_is_order_and_role_sensitive():
    a, b = text_digest("a"), text_digest("b")
    assert combine(KeyRole.CHAIN, a, b) != combine(KeyRole.CHAIN, b, a)
    assert combine(KeyRole.CHAIN, a, b) != combine(KeyRole.PREFIX, a, b)
    assert combine(KeyRole.CHAIN, a, b) == combine(KeyRole.CHAIN, int(a), int(b))
    # A composite key is not the digest of a text with the same bytes.
    assert combine(KeyRole.TEXT, a) != a


@given(st.text(max_size=200))
def test_normalisation_is_idempotent_and_digest_follows_it(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert text_digest(text) == text_digest(once)


@given(st.lists(st.text(max_size=20), max_size=8), st.randoms(use_true_random=False))
def test_action_set_key_ignores_order_and_repeats(actions, rng):
    shuffled = actions + actions[: len(actions) // 2]
    rng.shuffle(shuffled)
    assert action_set_key(shuffled) == action_set_key(actions)


def test_action_set_key_tells_sets_apart():
    keys = {
        int(action_set_key(s))
        for s in ([], ["a"], ["b"], ["a", "b"], ["a b"], ["ab"], ["a", "b", "c"], ["a, b"], ["a", ", b"])
    }
    assert len(keys) == 9  # no separator: ["a b"], ["a, b"] and ["a", "b"] are different sets
    assert action_set_key(["go  to desk 1 "]) == action_set_key(["go to desk 1"])  # actions are normalised
    assert action_set_key(["x"]) != combine(KeyRole.TEXT, text_digest("x"))  # its own role


def test_lone_surrogates_hash_instead_of_raising():
    assert isinstance(text_digest("bad \ud800 surrogate"), np.uint64)


def test_digests_identical_in_a_fresh_process():
    here = {text: hex_key(text_digest(text)) for text in SAMPLES}
    here["combine"] = hex_key(combine(KeyRole.WINDOW, text_digest("x"), 3))
    here["action_set"] = hex_key(action_set_key(SAMPLES))
    code = (
        "import json, sys\n"
        "from progpo_envs.core.hashing import KeyRole, action_set_key, combine, hex_key, text_digest\n"
        "texts = json.loads(sys.argv[1])\n"
        "out = {t: hex_key(text_digest(t)) for t in texts}\n"
        "out['combine'] = hex_key(combine(KeyRole.WINDOW, text_digest('x'), 3))\n"
        "out['action_set'] = hex_key(action_set_key(texts[::-1]))\n"
        "print(json.dumps(out))\n"
    )
    # A different PYTHONHASHSEED proves the keys do not depend on Python's salted hash().
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(SAMPLES)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(result.stdout) == here
