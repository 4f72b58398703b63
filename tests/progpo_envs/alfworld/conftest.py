"""Fixtures of the ALFWorld tests: a private game cache and a small generated game set.

The real trials come from ``shared_alfworld_data`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Games per split in the generated test set (one of each task type).
NUM_GENERATED = 6


@pytest.fixture(scope="session")
def progpo_cache(tmp_path_factory) -> Path:
    """A private cache for the session (rebuilt and generated games), also set as ``$PROGPO_CACHE``.

    Set for the whole session so that subprocesses started by the tests (determinism runs, ``spawn`` workers)
    find it.
    """
    path = tmp_path_factory.mktemp("progpo_cache")
    previous = os.environ.get("PROGPO_CACHE")
    os.environ["PROGPO_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("PROGPO_CACHE", None)
    else:
        os.environ["PROGPO_CACHE"] = previous


@pytest.fixture(scope="session")
def generated_root(progpo_cache) -> Path:
    """The folder containing ``json_2.1.1/train`` with :data:`NUM_GENERATED` generated games (made once)."""
    from progpo_envs.alfworld.data import generated_data_dir

    return generated_data_dir("train", NUM_GENERATED, seed=0)


@pytest.fixture(autouse=True)
def _no_user_alfworld_data(monkeypatch):
    """Tests choose their data explicitly: a user's ``$ALFWORLD_DATA`` must not leak in."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
