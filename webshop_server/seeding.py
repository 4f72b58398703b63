"""Portable seeds for the shop's random draws (generated catalogs, range prices, goal price bounds).

A draw is seeded by the 64-bit xxh3 digest (``xxhash.xxh3_64``, seed 0) of a text that names its purpose and
inputs, e.g. ``"price:0:B07XYZ"``, so the same catalog comes out in every process and on every machine (unlike
Python's salted ``hash()``). The text is first put in normal form: Unicode NFC, every whitespace run made one
space, ends stripped.

These are exactly the digests of the envs' content keys (``progpo_envs.core.hashing.text_digest``), which the
shop used before it had its own helper; keeping them identical keeps every generated catalog and goal list
byte for byte what it was (``tests/webshop_server/test_seeding.py`` checks the two agree).

Example:
    >>> text_seed("price:0:B07XYZ") == text_seed("  price:0:B07XYZ\\n")
    True
    >>> import random
    >>> random.Random(text_seed("catalog:0")).random() == random.Random(text_seed("catalog:0")).random()
    True
"""

from __future__ import annotations

import re
import unicodedata

import xxhash

_WHITESPACE_RUN = re.compile(r"\s+")


def text_seed(text: str) -> int:
    """The seed of ``text``: xxh3-64 of its UTF-8 bytes after NFC and whitespace normalisation."""
    normal = _WHITESPACE_RUN.sub(" ", unicodedata.normalize("NFC", text)).strip()
    return xxhash.xxh3_64_intdigest(normal.encode("utf-8", "surrogatepass"))
