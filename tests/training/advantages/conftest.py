"""Shared fixtures for the advantage-estimator tests.

Helper modules of this folder (``advantages_batches``, ``advantages_reference``, ``advantages_toy``) are
imported by their package names, ``tests.training.advantages.<module>`` (pytest's importlib mode; the
repository root is on ``sys.path``). ``tests/conftest.py`` imports ``advantages_toy``, which registers the toy
estimator, before any test module is collected, so every test parametrised over ``ESTIMATORS`` covers it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.training.advantages.advantages_batches import build_batch

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def loop_batch() -> dict[str, np.ndarray]:
    """One task group: a succeeds through a self-loop (s0 s1 s1 s2 -> success), b fails (s0 s1 s3)."""
    return build_batch(
        [
            {
                "group": 0,
                "obs": ["s0", "s1", "s1", "s2"],
                "actions": ["go", "wait", "go", "take"],
                "success": True,
            },
            {"group": 0, "obs": ["s0", "s1", "s3"], "actions": ["go", "jump", "look"]},
        ]
    )
