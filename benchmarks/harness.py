"""What every benchmark shares around its measurement: its settings as a command line, and what it declares
about itself for the results page and ``progpo bench``.

**Settings.** A benchmark's settings are one dataclass of :func:`option` fields (each a default and
what it means); :func:`parse_config` makes the command line from it, one ``--flag-name`` per field (the
field's type says how to parse it: ``list[int]`` takes several values, ``bool`` is a switch, ``X | None``
may be left out), with the defaults in ``--help`` and one-line errors with exit status 2
(:class:`progpo_base.usage.CommandParser`, as every ``progpo`` command). A ``ValueError`` or a
:class:`~progpo_base.usage.UsageError` that the dataclass raises in ``__post_init__`` is a usage error too.
The result file records the command that made it (:func:`recorded_command`) and the settings
(``dataclasses.asdict``).

**Spec.** A benchmark module ends with ``SPECS``: one :class:`Benchmark` per result file it writes (a module
whose settings write several files, such as ``compare_estimators.py``, declares one each), with the renderer
of its section beside it. :mod:`benchmarks.report` finds every module that declares ``SPECS`` and builds the
page from them; a renderer reads only its own result file.

Example:
    >>> @dataclass
    ... class Settings:
    ...     sizes: list[int] = option([1000], "rows per batch")
    ...     quick: bool = option(False, "a smoke run")
    ...     out: str = option("results/demo.json", "result file")
    >>> parse_config(Settings, ["--sizes", "10", "20", "--quick"], "A demo.")
    Settings(sizes=[10, 20], quick=True, out='results/demo.json')
    >>> recorded_command("benchmarks/demo.py", ["--sizes", "10"])
    'python benchmarks/demo.py --sizes 10'
    >>> spec = Benchmark("demo", script_path(__file__), "What it measures.", "python -m benchmarks.demo")
    >>> spec.script, spec.quick_args
    ('benchmarks/harness.py', None)
"""

from __future__ import annotations

import dataclasses
import shlex
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from progpo_base.usage import CommandParser, UsageError

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


def option(default: Any, doc: str, flag: str | None = None, **argparse_kwargs: Any) -> Any:
    """A settings field that is also a command-line option: its default, what it means (the option's help),
    its flag when it is not ``--field-name`` (``--env`` for a field ``envs``), and any ``argparse`` keyword
    that its type does not imply (``choices``, ``nargs="*"``, ``action="append"``, ``required``)."""
    metadata = {"doc": doc, "flag": flag, "argparse": argparse_kwargs}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _argument(annotation: Any, default: Any) -> dict[str, Any]:
    """The ``argparse`` keywords a field's type implies."""
    if isinstance(annotation, types.UnionType):  # ``X | None``: the option may be left out
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        return {"action": "store_false" if default else "store_true"}
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return {"nargs": "+", "type": item}
    return {"type": annotation}


def build_parser(cls: type, description: str, prog: str | None = None) -> CommandParser:
    """The command line of the settings dataclass ``cls``: one ``--flag-name`` per :func:`option` field."""
    parser = CommandParser(prog=prog, description=description)
    hints = typing.get_type_hints(cls)
    base = cls()
    for f in dataclasses.fields(cls):
        default = getattr(base, f.name)
        kwargs = {**_argument(hints[f.name], default), **f.metadata.get("argparse", {})}
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=default, help=f.metadata.get("doc"), **kwargs)
    return parser


def parse_config(cls: type, argv: Sequence[str] | None, description: str, prog: str | None = None) -> Any:
    """The settings ``cls`` from the command line ``argv`` (``None``: ``sys.argv[1:]``); a bad value exits
    with one line and status 2."""
    parser = build_parser(cls, description, prog)
    args = parser.parse_args(argv)
    try:
        return cls(**vars(args))
    except (ValueError, UsageError) as exc:
        parser.error(str(exc))


def usage_error(message: str, prog: str | None = None) -> NoReturn:
    """Stop with ``message`` as a usage error found after parsing (one line, exit status 2), as
    :func:`parse_config` reports one found while parsing."""
    CommandParser(prog=prog).error(message)


def recorded_command(script: str, argv: Sequence[str]) -> str:
    """The command line a result file records: ``python <script> <argv>``, quoted as a shell would need."""
    return f"python {script} {shlex.join(argv)}".strip()
