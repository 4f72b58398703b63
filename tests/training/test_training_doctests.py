"""The runnable examples in the training package's docstrings stay correct (every module, estimators too)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import training

MODULES = sorted(m.name for m in pkgutil.walk_packages(training.__path__, "training."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0
