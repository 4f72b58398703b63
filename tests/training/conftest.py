"""Shared fixtures of the training tests: one thread, a tiny Qwen2 policy folder, the toy env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory) -> Path:
    """A saved tiny random Qwen2 (truncated Qwen2.5 tokenizer), loaded through ``from_pretrained``."""
    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy

    return build_tiny_policy(
        tmp_path_factory.mktemp("tiny_policy"),
        TinyModelConfig(vocab_size=2048, hidden_size=64, intermediate_size=128),
    )


@pytest.fixture
def toy_vec():
    """A 2×2 group vector env of the toy env (sync), closed after the test."""
    import gymnasium as gym

    from progpo_envs.testing import DRAWER_ENV_ID

    envs = gym.make_vec(DRAWER_ENV_ID, num_envs=4, group_size=2, max_steps=4, expert=True)
    yield envs
    envs.close()
