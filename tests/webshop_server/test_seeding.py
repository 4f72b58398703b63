"""The shop's seed helper gives the envs' content digests exactly, so generated catalogs never change."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from progpo_envs.core.hashing import text_digest
from webshop_server.seeding import text_seed

# The shapes of the texts the shop seeds with, and texts whose normal form differs from themselves.
SEED_TEXTS = [
    "catalog:0",
    "price:0:B07XYZ1234",
    "price_upper:12345:B000ABCDEF:3",
    "",
    "   ",
    "  a\tb\n\nc  ",
    "\u00a0x\u2003y\u3000",
    "cafe\u0301",  # decomposed: NFC composes it
    "caf\u00e9",
    "\ud800 lone surrogate",
    "emoji \U0001f600 and 中文",
]


def test_text_seed_equals_text_digest_on_the_shops_texts_and_normal_form_edge_cases():
    purposes = ("specs", "price", "human")
    texts = SEED_TEXTS + [f"{purpose}:{seed}" for purpose in purposes for seed in range(200)]
    for text in texts:
        assert text_seed(text) == int(text_digest(text)), repr(text)
    assert type(text_seed("catalog:0")) is int


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=40))
def test_text_seed_equals_text_digest_on_any_text(text):
    assert text_seed(text) == int(text_digest(text))


def test_text_seed_is_a_fixed_digest():
    """Pinned values: a change of algorithm, seed or normal form would move every generated catalog."""
    assert text_seed("look") == 0x983396B5F3351616  # the digest progpo_envs.core.hashing documents
    assert text_seed("  look\n") == text_seed("look")


def test_the_shop_imports_no_env_code():
    """The shop is the bottom layer: its site and catalog load neither progpo_envs nor gymnasium."""
    code = (
        "import sys, webshop_server.app, webshop_server.catalog, webshop_server.expert; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('progpo_envs', 'gymnasium')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
