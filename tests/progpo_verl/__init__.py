"""Tests of progpo_verl."""
