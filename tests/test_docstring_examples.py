"""The runnable examples in the docstrings of every module of the six packages (the envs, the WebShop site,
the agents, training, the benchmarks and the verl-agent plugin), the base package and the ``progpo`` command
stay correct.

Each module's examples run in an empty working folder (examples that write files write them there); the
ALFWorld games, WebShop catalogs and search indexes they generate go to the test session's own
``PROGPO_CACHE`` (set in ``tests/conftest.py``). An example that cannot run offline says so in its module with
a doctest directive (``# doctest: +SKIP``); this runner skips no module.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = (
    "progpo_base",
    "progpo_envs",
    "webshop_server",
    "agents",
    "training",
    "benchmarks",
    "progpo_verl",
    "progpo",
)


def _modules(package_name: str) -> list[str]:
    """The package and every module under it."""
    package = importlib.import_module(package_name)
    return [package_name, *(m.name for m in pkgutil.walk_packages(package.__path__, package_name + "."))]


MODULES = sorted(name for package in PACKAGES for name in _modules(package))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0
