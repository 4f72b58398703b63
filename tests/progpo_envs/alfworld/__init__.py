"""Tests of progpo_envs.alfworld."""
