"""The runnable examples in the benchmarks' docstrings stay correct (the results page, the comparison's
statistics, the bench command)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import benchmarks

MODULES = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__, "benchmarks."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0
