"""Tests of progpo_envs.core."""
