"""Settings of the core tests (their toy env is ``progpo_envs.testing.CounterEnv``)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
