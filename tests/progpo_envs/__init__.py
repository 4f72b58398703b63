"""Tests of progpo_envs, one folder a subpackage."""
