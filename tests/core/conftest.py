"""Fixtures of the core tests: the toy env's entry point (importable in subprocess workers too)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

CORE_TESTS = Path(__file__).resolve().parent
# ``toy_env`` is imported by its entry point string; multiprocessing hands this sys.path to async workers.
if str(CORE_TESTS) not in sys.path:
    sys.path.insert(0, str(CORE_TESTS))
os.environ.setdefault("OMP_NUM_THREADS", "1")

TOY_ENTRY_POINT = "toy_env:ToyEnv"


@pytest.fixture
def toy_entry_point() -> str:
    return TOY_ENTRY_POINT
