"""Tests of agents."""
