"""Tests of progpo_envs.webshop."""
