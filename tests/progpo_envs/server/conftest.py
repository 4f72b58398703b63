"""Fixtures of the env-server tests: a toy env served on a loopback port by a background waitress server."""

from __future__ import annotations

import pytest

from tests.progpo_envs.server.hosting_helpers import serve_toy


@pytest.fixture(scope="module")
def toy_server():
    """One toy server per test module (2 env workers)."""
    server = serve_toy()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def toy_url(toy_server) -> str:
    return toy_server.url
