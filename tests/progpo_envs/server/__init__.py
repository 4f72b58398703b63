"""Tests of progpo_envs.server."""
