"""Settings shared by every test: single-threaded math, no hub access, the real ALFWorld trials when given."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Set before torch/transformers are imported anywhere: 2 shared cores make OpenMP barriers very slow.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Generated games, catalogs and indexes go to a cache private to this test session (inherited by every server
# and worker subprocess), so tests never read what another version of the code left in the user's
# ~/.cache/progpo.
_OWN_CACHE = "PROGPO_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["PROGPO_CACHE"] = tempfile.mkdtemp(prefix="progpo-test-cache-")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run and machine, so CI never fails by chance;
# `HYPOTHESIS_PROFILE=explore` draws fresh random examples when hunting for new failures.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

REPO_ROOT = Path(__file__).resolve().parents[1]
#: A folder holding real ALFWorld trials (`json_2.1.1/`), for the tests that compare against them; .ci/run
#: sets it where such a folder is at hand, and the tests that need it skip without it.
REAL_ALFWORLD_DATA_VAR = "PROGPO_TEST_ALFWORLD_DATA"


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["PROGPO_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def shared_alfworld_data() -> Path:
    """The folder that contains the real ALFWorld `json_2.1.1/` trials (skips if not given)."""
    path = Path(os.environ.get(REAL_ALFWORLD_DATA_VAR, "/nonexistent"))
    if not (path / "json_2.1.1").is_dir():
        pytest.skip(f"no real ALFWorld trials: set {REAL_ALFWORLD_DATA_VAR} to a folder with json_2.1.1/")
    return path
