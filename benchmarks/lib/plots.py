"""The benchmarks' plots: a figure of side-by-side panels written as the results page shows plots, and the
two kinds of panel they draw (grouped or stacked bars, lines).

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "demo.png"
    >>> with figure(path, panels=2) as (left, right):
    ...     bars(left, ["a", "b"], {"before": [1, 2], "after": [2, 3]}, ylabel="success")
    ...     lines(right, {"progpo": ([1, 2, 3], [0.1, 0.2, 0.4])}, xlabel="iteration")
    >>> path.read_bytes()[:4]
    b'\\x89PNG'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def figure(
    path: Path, panels: int = 1, width=5.5, height=3.8, title="", rows: int = 1, **subplots
) -> Iterator:
    """Axes of ``panels`` side-by-side panels (each ``width`` × ``height``), or of ``rows`` rows of them (a
    list per row), with ``plt.subplots``' other options; on exit the figure is laid out, written to ``path``
    (110 dpi) and closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = (width * panels, height * rows)
    fig, axes = plt.subplots(rows, panels, figsize=size, squeeze=False, **subplots)
    try:
        yield list(axes[0]) if rows == 1 else [list(row) for row in axes]
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def bars(
    ax,
    labels: Sequence[str],
    series: dict[str, Sequence[float | None]],
    errors: dict[str, Sequence[float | None]] | None = None,
    stacked: bool = False,
    log: bool = False,
    **axis: str,
) -> None:
    """One bar per label and series, side by side (or ``stacked``), with error bars where ``errors`` has the
    series; ``axis``: ``title``, ``xlabel``, ``ylabel``. Missing values are drawn as 0."""
    import numpy as np

    x = np.arange(len(labels))
    width = 0.6 if stacked else 0.8 / len(series)
    bottom = np.zeros(len(labels))
    for k, (name, values) in enumerate(series.items()):
        heights = np.array([v or 0.0 for v in values], dtype=float)
        error = [e or 0.0 for e in errors[name]] if errors and name in errors else None
        offset = 0.0 if stacked else (k - (len(series) - 1) / 2) * width
        ax.bar(x + offset, heights, width, bottom=bottom, yerr=error, capsize=3, label=name)
        bottom = bottom + heights if stacked else bottom
    ax.set_xticks(x, labels, fontsize=7, rotation=30 if max(map(len, labels), default=0) > 12 else 0)
    ax.set(**axis)
    if log:
        ax.set_yscale("log")
    if len(series) > 1:
        ax.legend(fontsize=7)


def lines(ax, series: dict[str, tuple[Sequence[float], Sequence[float | None]]], **axis: str) -> None:
    """One line with markers per series ``name -> (xs, ys)`` (a missing y leaves a gap)."""
    for name, (xs, ys) in series.items():
        ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", ms=3, label=name)
    ax.set(**axis)
    if len(series) > 1:
        ax.legend(fontsize=7)
