"""Deterministic content hashing: the keys that step-level group RL groups by.

Every key is a 64-bit xxh3 digest (``xxhash.xxh3_64``, seed 0) of UTF-8 bytes, returned as ``numpy.uint64``.
The digest is specified by its algorithm, not by the Python process, so the same text gives the same key in
every process, on every machine and in every Python version (unlike ``hash()``, which is salted per process).

Normalisation (applied to observations and actions before hashing, :func:`normalize_text`):

1. Unicode NFC, so that composed and decomposed accents hash alike;
2. every run of whitespace (spaces, tabs, newlines, NBSP, ...) becomes one space;
3. leading and trailing whitespace is removed.

Case and punctuation are kept: "Open drawer 1" and "open drawer 1" are different texts to an LLM.

Composite keys (history chains, windows, action sets) combine 64-bit digests by hashing their little-endian
packing under a distinct seed per role (:class:`KeyRole`), so a chain value can never be confused with a plain
text digest.

Example:
    >>> int(text_digest("You arrive at  drawer 1.\\n")) == int(text_digest("You arrive at drawer 1."))
    True
    >>> hex_key(text_digest("look"))
    '983396b5f3351616'
"""

from __future__ import annotations

import enum
import re
import struct
import unicodedata
from collections.abc import Iterable

import numpy as np
import xxhash

_WHITESPACE = re.compile(r"\s+")


class KeyRole(enum.IntEnum):
    """xxh3 seeds that separate the kinds of composite keys."""

    TEXT = 0
    CHAIN = 1
    PREFIX = 2
    WINDOW = 3
    ACTION_SET = 4


def normalize_text(text: str) -> str:
    """NFC-normalise, collapse whitespace runs to one space, and strip."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def text_digest(text: str) -> np.uint64:
    """The 64-bit key of a text after :func:`normalize_text`."""
    return np.uint64(xxhash.xxh3_64_intdigest(normalize_text(text).encode("utf-8", "surrogatepass")))


def combine(role: KeyRole, *keys: int | np.uint64) -> np.uint64:
    """Hash an ordered tuple of 64-bit keys into one, under ``role``."""
    packed = struct.pack(f"<{len(keys)}Q", *(int(k) for k in keys))
    return np.uint64(xxhash.xxh3_64_intdigest(packed, seed=int(role)))


def action_set_key(actions: Iterable[str]) -> np.uint64:
    """The 64-bit key of a *set* of actions (a state's admissible actions): order and repeats do not matter.

    The sorted, de-duplicated :func:`text_digest` of each action, combined under ``KeyRole.ACTION_SET``; no
    separator is needed, so no action text can make two different sets collide by concatenation.

    Example:
        >>> int(action_set_key(["look", "eat"])) == int(action_set_key(["eat", "look", "look"]))
        True
        >>> int(action_set_key(["look"])) == int(action_set_key(["look", "inventory"]))
        False
    """
    return combine(KeyRole.ACTION_SET, *sorted({int(text_digest(a)) for a in actions}))


def hex_key(key: int | np.uint64) -> str:
    """A key as 16 lowercase hex digits (for JSON, file names and logs)."""
    return f"{int(key):016x}"
