"""The runnable examples in the docstrings of the training package (every module, estimators too) and of the
benchmarks (the results page, the comparison's statistics, the bench command) stay correct."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import benchmarks
import training

MODULES = sorted(
    m.name
    for package in (training, benchmarks)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0
