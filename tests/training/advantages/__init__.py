"""Tests of training.advantages."""
