"""Markdown tables of result values, for the results page: one cell format, the table, and the generic
rendering of any result JSON that a benchmark gives no renderer of its own.

Example:
    >>> print(generic_tables({"steps": 3, "machine": {"cpu_count": 2}}))
    | key | value |
    |---|---|
    | steps | 3 |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

MAX_TABLE_ROWS = 40
MAX_TABLE_COLS = 12


def fmt(value: Any) -> str:
    """A cell: floats to 4 significant digits, None as a dash, lists compactly."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value[:8]) + (" …" if len(value) > 8 else "")
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub-flavoured Markdown table.

    Example:
        >>> print(markdown_table(["a", "b"], [[1, 0.5], [None, True]]))
        | a | b |
        |---|---|
        | 1 | 0.5 |
        | — | yes |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _is_scalar(v: Any) -> bool:
    return (
        v is None
        or isinstance(v, bool | int | float | str)
        or (isinstance(v, list) and all(isinstance(x, bool | int | float | str) for x in v) and len(v) <= 8)
    )


def _flatten(obj: Any, prefix: str = "", depth: int = 3) -> dict[str, Any]:
    """Scalar leaves of nested dicts as ``a.b.c -> value`` (to ``depth`` levels)."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict) and depth > 0:
        for k, v in obj.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if _is_scalar(v):
                out[key] = v
            else:
                out.update(_flatten(v, key, depth - 1))
    return out


def generic_tables(data: dict, skip: Iterable[str] = ("machine", "command", "config", "git")) -> str:
    """Render any result JSON: top-level scalars as one key/value table, each dict (or list) of records as a
    table with one row per record and its scalar leaves as columns."""
    parts: list[str] = []
    scalars = {k: v for k, v in data.items() if k not in skip and _is_scalar(v)}
    if scalars:
        parts.append(markdown_table(["key", "value"], scalars.items()))
    for key, value in data.items():
        if key in skip or _is_scalar(value):
            continue
        records: list[tuple[str, dict]] = []
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            records = [(str(i), _flatten(v)) for i, v in enumerate(value)]
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            records = [(str(k), _flatten(v)) for k, v in value.items()]
        elif isinstance(value, dict):
            flat = _flatten(value)
            if flat:
                parts.append(
                    f"**{key}**\n\n" + markdown_table(["key", "value"], list(flat.items())[:MAX_TABLE_ROWS])
                )
            continue
        if not records:
            continue
        columns: list[str] = []
        for _, rec in records:
            columns += [c for c in rec if c not in columns]
        shown = columns[:MAX_TABLE_COLS]
        note = f" ({len(columns) - len(shown)} more columns in the JSON)" if len(columns) > len(shown) else ""
        table = markdown_table(
            [key, *shown], ([name, *(rec.get(c) for c in shown)] for name, rec in records[:MAX_TABLE_ROWS])
        )
        parts.append(f"**{key}**{note}\n\n{table}")
    return "\n\n".join(parts)


def section_body(render: Callable[[dict], str] | None, data: dict) -> str:
    """A result's section: its curated renderer's, or the generic tables when it has none or the JSON has
    another shape than the renderer expects (a result recorded before its layout changed)."""
    if render is not None:
        try:
            return render(data)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            pass
    return generic_tables(data)
