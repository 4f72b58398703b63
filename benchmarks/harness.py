"""What every benchmark shares around its measurement: its settings as a command line, the suite it belongs
to, the result file it writes and what it declares for the results page and ``progpo bench``.

**Suites.** A suite (``benchmarks/bench_<thing>.py``) measures one thing the product does; each of its
:class:`Part` s is one measurement: a settings dataclass of :func:`option` fields (one ``--flag-name`` each;
the field's type says how to parse it: ``list[int]`` takes several values, ``bool`` is a switch, ``X | None``
may be left out; defaults in ``--help``; a bad value is one line and exit status 2, as every ``progpo``
command) and a function from settings to result. :func:`run_suite` (a suite's ``main``) parses ``PART
--flags``, records the machine's load before and after, writes the result with the command that reruns it
(``command``) and the machine, its plot beside it, and prints the section the results page shows. A part's
``--quick`` run writes under ``runs/bench_quick/`` unless ``--out`` says otherwise, so that a smoke run never
replaces a committed result; a result with a non-empty ``failed`` list exits with status 1.

**Specs.** A suite module ends with ``SPECS``: one :class:`Benchmark` per result file it writes, with the
renderer of its section beside it; what each measures is its section of ``benchmarks/measures.md``.
:mod:`benchmarks.report` finds every module that declares ``SPECS`` and builds the page from them; a renderer
reads only its own result file.

Example:
    >>> @dataclass
    ... class Settings:
    ...     sizes: list[int] = option([1000], "rows per batch")
    ...     quick: bool = option(False, "a smoke run")
    >>> parse_config(Settings, ["--sizes", "10", "20", "--quick"], "A demo.")
    Settings(sizes=[10, 20], quick=True)
    >>> recorded_command("benchmarks/demo.py", ["speed", "--sizes", "10"])
    'python benchmarks/demo.py speed --sizes 10'
    >>> Benchmark("demo", ["speed"], script="benchmarks/demo.py").command
    'python benchmarks/demo.py speed'
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from benchmarks.common import RESULTS_DIR, ROOT, machine_info, save_result
from progpo_base.usage import CommandParser, UsageError

#: Where a ``--quick`` run writes its result when ``--out`` is not given.
QUICK_DIR = ROOT / "runs" / "bench_quick"


@dataclass(frozen=True)
class Benchmark:
    """One result file of the project as the page lists it.

    Attributes:
        name: result file stem (``results/<name>.json``) and section title.
        args: the suite's arguments of the full run (its part first), for ``progpo bench --full``.
        quick: whether ``args + ["--quick"]`` is a quick version (for ``progpo bench``).
        render: curated renderer (JSON dict -> Markdown), or None for
            :func:`benchmarks.lib.markdown.generic_tables`.
        command: the full run as the page shows it, when it is not ``python <script> <args>`` (another
            Python, a run it needs first).
        script: the suite's path relative to the repository root (:func:`benchmarks.report.discover` sets it
            from the module that declares the spec).
        measures: one paragraph: what it measures and the claim checked (``discover`` reads it from
            ``benchmarks/measures.md``: prose lives with prose, the page's Markdown as Markdown).
    """

    name: str
    args: list[str] = field(default_factory=list)
    quick: bool = True
    render: Callable[[dict], str] | None = None
    command: str = ""
    script: str = ""
    measures: str = ""

    def __post_init__(self):
        if self.script and not self.command:
            object.__setattr__(self, "command", recorded_command(self.script, self.args))

    @property
    def quick_args(self) -> list[str] | None:
        return [*self.args, "--quick"] if self.quick else None


@dataclass(frozen=True)
class Part:
    """One measurement of a suite: its settings dataclass, ``run(settings) -> result``, an optional
    ``plot(result, path)``, and the stem of its result file (a string, or ``settings -> str``; default: the
    part's name)."""

    settings: type
    run: Callable[[Any], dict]
    plot: Callable[[dict, Path], None] | None = None
    name: str | Callable[[Any], str] | None = None


def option(default: Any, doc: str, flag: str | None = None, **argparse_kwargs: Any) -> Any:
    """A settings field that is also a command-line option: its default, what it means (the option's help),
    its flag when it is not ``--field-name`` (``--env`` for a field ``envs``), and any ``argparse`` keyword
    that its type does not imply (``choices``, ``nargs="*"``, ``action="append"``: one value a flag)."""
    metadata = {"doc": doc, "flag": flag, "argparse": argparse_kwargs}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass
class PartSettings:
    """What the settings of every part share (their dataclasses derive from it): where the result goes."""

    out: Path | None = option(None, "result file (default: results/<name>.json; --quick: runs/bench_quick/)")


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


def defaults(cls: type) -> dict[str, Any]:
    """The default of each field of the settings dataclass ``cls`` (without running its checks)."""
    missing = dataclasses.MISSING
    return {
        f.name: f.default if f.default_factory is missing else f.default_factory()
        for f in dataclasses.fields(cls)
    }


def add_options(parser: CommandParser, cls: type) -> CommandParser:
    """One ``--flag-name`` per :func:`option` field of the settings dataclass ``cls`` on ``parser``."""
    hints, base = typing.get_type_hints(cls), defaults(cls)
    for f in dataclasses.fields(cls):
        default = base[f.name]
        kwargs = {**_argument(hints[f.name], default), **f.metadata.get("argparse", {})}
        if kwargs.get("action") == "append":  # a list given one value a flag
            kwargs.pop("nargs", None)
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=default, help=f.metadata.get("doc"), **kwargs)
    return parser


def _settings(parser: CommandParser, cls: type, values: Mapping[str, Any]) -> Any:
    fields = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in values.items() if k in fields})
    except (ValueError, UsageError) as exc:  # the dataclass's own checks are usage errors too
        parser.error(str(exc))


def parse_config(cls: type, argv: Sequence[str] | None, description: str, prog: str | None = None) -> Any:
    """The settings ``cls`` from the command line ``argv`` (``None``: ``sys.argv[1:]``)."""
    parser = add_options(CommandParser(prog=prog, description=description), cls)
    return _settings(parser, cls, vars(parser.parse_args(argv)))


def settings_argv(settings: Any, **changes: Any) -> list[str]:
    """The flags that parse back to ``settings`` with ``changes`` (for a part run in a process of its own);
    ``out`` is left to the caller.

    Example:
        >>> @dataclass
        ... class Settings:
        ...     rows: int = option(8, "rows")
        ...     quick: bool = option(False, "a smoke run")
        ...     sizes: list[int] = option([1], "sizes")
        >>> settings_argv(Settings(rows=2), quick=True)
        ['--rows', '2', '--quick']
    """
    argv, base = [], defaults(type(settings))
    for f in dataclasses.fields(settings):
        value = changes.get(f.name, getattr(settings, f.name))
        if f.name == "out" or value == base[f.name] or value is None:
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag)
        else:
            argv += [flag, *map(str, value if isinstance(value, list) else [value])]
    return argv


def settings_record(settings: Any) -> dict[str, Any]:
    """``settings`` as the result file records them (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()}


def usage_error(message: str, prog: str | None = None) -> NoReturn:
    """Stop with ``message`` as a usage error found after parsing (one line, exit status 2)."""
    CommandParser(prog=prog).error(message)


def recorded_command(script: str, argv: Sequence[str]) -> str:
    """The command line a result file records: ``python <script> <argv>``, quoted as a shell would need."""
    return f"python {script} {shlex.join(argv)}".strip()


def script_path(module_file: str) -> str:
    """A benchmark module's path relative to the repository root: ``script_path(__file__)``."""
    return Path(module_file).resolve().relative_to(ROOT).as_posix()


def result_path(name: str, settings: Any) -> Path:
    """Where a part's result goes: ``--out``, else ``results/<name>.json`` (``runs/bench_quick/`` when
    ``--quick``)."""
    out = getattr(settings, "out", None)
    if out:
        return Path(out)
    return (QUICK_DIR if getattr(settings, "quick", False) else RESULTS_DIR) / f"{name}.json"


def run_suite(
    module_file: str,
    parts: Mapping[str, Part] | Part,
    specs: Sequence[Benchmark],
    doc: str,
    argv: Sequence[str] | None = None,
) -> int:
    """A suite's ``main``: run the part the command line names (nothing to name when the module has one
    :class:`Part`) and write its result (module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script = script_path(module_file)
    parser = CommandParser(prog=f"python {script}", description=doc.split("\n\n")[0])
    if isinstance(parts, Part):
        key, part = None, parts
        values = vars(add_options(parser, part.settings).parse_args(argv))
    else:
        choices = parser.add_subparsers(dest="part", required=True, metavar="PART")
        for name, each in parts.items():
            summary = (each.run.__doc__ or "").split("\n\n")[0]
            add_options(choices.add_parser(name, help=summary, description=summary), each.settings)
        values = vars(parser.parse_args(argv))
        key = values["part"]
        part = parts[key]
    return run_part(script, part, _settings(parser, part.settings, values), argv, specs, key)


def script_main(module: str, module_file: str, parts: Mapping[str, Part] | Part, specs, doc: str) -> Callable:
    """A benchmark module's ``main(argv=None)``: :func:`run_suite` over ``parts``; run at once (its exit
    status the process's) when ``module`` is ``"__main__"``, the module being the script run:
    ``main = script_main(__name__, __file__, PARTS, SPECS, __doc__)``."""

    def main(argv: Sequence[str] | None = None) -> int:
        return run_suite(module_file, parts, specs, doc, argv)

    if module == "__main__":
        sys.exit(main())
    return main


def run_part(
    script: str, part: Part, settings: Any, argv: list[str], specs: Sequence[Benchmark], key: str | None
) -> int:
    """Run ``part`` with ``settings``; write its result (the command, the machine and its load before and
    after added), its plot, and print its page section; exit status 1 when its ``failed`` list is not
    empty."""
    from rich.console import Console
    from rich.markdown import Markdown

    from benchmarks.lib.markdown import section_body

    name = part.name(settings) if callable(part.name) else part.name or key
    load_before = os.getloadavg()
    result = part.run(settings)
    extra = result.pop("machine", {})
    result = {"benchmark": name, "command": recorded_command(script, argv), **result}
    load = {"load_average_before": load_before, "load_average_after": os.getloadavg()}
    result["machine"] = machine_info(**extra, **load)
    out = save_result(result, result_path(name, settings))
    if part.plot is not None:
        part.plot(result, out.with_suffix(".png"))
    spec = next((s for s in specs if s.name == out.stem), None) or next(s for s in specs if s.name == name)
    console = Console(width=160)
    console.print(Markdown(section_body(spec.render, result)))
    console.print(f"wrote {out}" + (f" and {out.with_suffix('.png').name}" if part.plot else ""))
    for line in result.get("failed") or []:
        console.print(f"[red]failed: {line}", highlight=False)
    return 1 if result.get("failed") else 0
