"""The runnable examples in the data layer's docstrings stay correct."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "webshop_server.catalog",
    "webshop_server.catalog.cli",
    "webshop_server.catalog.generator",
    "webshop_server.catalog.loader",
    "webshop_server.goals",
    "webshop_server.reward",
    "webshop_server.search.index",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.setenv("PROGPO_CACHE", str(tmp_path))  # examples that cache write under tmp_path
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0
