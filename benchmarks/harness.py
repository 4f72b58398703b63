"""What a benchmark declares about itself, for the results page and ``progpo bench``.

A benchmark module ends with ``SPECS``: one :class:`Benchmark` per result file it writes (a module whose
settings write several files, such as ``compare_estimators.py``, declares one each), with the renderer of its
section beside it. :mod:`benchmarks.report` finds every module that declares ``SPECS`` and builds the page
from them; a renderer reads only its own result file.

Example:
    >>> spec = Benchmark("demo", script_path(__file__), "What it measures.", "python -m benchmarks.demo")
    >>> spec.script, spec.quick_args
    ('benchmarks/harness.py', None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the project as the page lists it.

    Attributes:
        name: result file stem (``results/<name>.json``) and section title.
        script: path of the script, relative to the repository root (:func:`script_path`).
        measures: one paragraph: what it measures and the claim checked.
        command: the full run.
        quick_args: arguments of its quick version (for ``progpo bench``); None = no quick version.
        render: curated renderer (JSON dict -> Markdown), or None for
            :func:`benchmarks.lib.markdown.generic_tables`.
        full_args: arguments of its full run (``progpo bench --full``; default: the script's defaults).
    """

    name: str
    script: str
    measures: str
    command: str
    quick_args: list[str] | None = field(default=None)
    render: Callable[[dict], str] | None = None
    full_args: list[str] = field(default_factory=list)


def script_path(module_file: str) -> str:
    """A benchmark module's path relative to the repository root: ``script_path(__file__)``."""
    return Path(module_file).resolve().relative_to(ROOT).as_posix()
