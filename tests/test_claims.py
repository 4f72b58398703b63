"""Every figure the project states is a measured value: each figure in ``README.md``, in the docs pages it
links for details (:data:`CLAIM_DOCS`), in the leading comment header of each ``configs/*.yaml`` and on the
results page ``benchmarks/README.md`` equals a value in a committed result file ``benchmarks/results/*.json``
(issue 20: no hand-typed figures), or in the papers' numbers ``benchmarks/data/*.json``. A retired benchmark's
finding stays in the docs with the commit that holds its result file, cited as ```name.json` of commit
`abcdef123456``` (:data:`RETIRED`): that file, read from the git history, counts too.

**What counts as a figure** (a measured quantity someone could mistype or leave stale):

- a decimal number: ``0.275``, ``11.68``, ``+0.300`` (the sign is ignored: a difference may be stated as a
  loss or a gain);
- a percentage: ``32.3%``, ``35-38%`` (both ends of a range carry the ``%``), or percentage points:
  ``7.3 points``, ``+5.6 ± 6.4 points``;
- a number with a unit of measure: ``782 s``, ``100 ms``, ``1.2 GB``, ``9.9×``, ``1.6x``, ``8.8M``;
  ``13 min 3 s`` is one figure in seconds;
- a number in scientific notation with a decimal mantissa: ``1.234e+06`` (how the page writes big values).

**What does not** (settings, names and references, not measurements):

- integers without a unit or ``%``: counts and settings such as "3 seeds", "30 iterations", "2 cores",
  "4 groups × 4", "issue 8", years, table row counts;
- scientific notation without a decimal mantissa: settings such as learning rates ``3e-4``, ``1e-6``;
- anything inside Markdown code (fenced blocks, ``code spans``: commands, flags, config keys and values), link
  targets and HTML comments;
- a word that starts with a letter and holds digits (identifiers and labels: ``Qwen2.5-1.5B/7B``,
  ``FloorPlan308``, ``p=0.5``, ``n=3``, ``iter_000030``, ``v3``), version numbers (``3.11.7``; ``Python ≥
  3.10``), dates (``2026-11-30``), arXiv ids (``2505.10978``) and commit hashes.

A figure followed by ``± spread`` (or ``+-``) is one figure with its spread.

**Equal to a value**: a figure shown with ``d`` decimals equals a value ``v`` when ``|v − figure| ≤ ½·10⁻ᵈ``
(the value rounds to the figure); a percentage may equal the fraction (``32.3%`` ≈ 0.323) or the number
itself; a duration in minutes and seconds equals a value in seconds (to the second); ``a ± b`` equals two
numbers of one JSON object (e.g. ``success`` and ``success_std``) or an ``a ± b`` written in a JSON string,
which makes a stale "mean ± spread" much harder to pass by coincidence than a lone figure. The values are
every number in the result files: numeric leaves and numbers written inside strings (the display strings
such as ``"0.086 ± 0.019 (n=3)"``), plus the two derivations the results page and the README state: each
estimator's difference from GRPO paired by seed in a comparison's runs, OpenEnv's throughput as a share of
the native protocol's (the reciprocal of ``hosting.json``'s ``native_vs_openenv_N``), and a count of bytes
(a key ending in ``_bytes``) stated in MiB.

A lone figure with three decimals is a weak check: the result files hold thousands of values, so about half
of all three-decimal fractions coincide with one of them; such a figure passing says only that nothing
contradicts it. The page's own generator is checked more strictly: it may type no figure at all.

On failure the test prints each figure that no result holds, with its file and line.
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as ROOT

RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT / "benchmarks" / "data"
#: A retired result cited with the commit that holds it: ```kernel_paths.json` of commit `f598421e92e1```.
RETIRED = re.compile(r"`(?:benchmarks/results/)?([\w.-]+\.json)` of commit `([0-9a-f]{7,40})`")


@dataclass(frozen=True)
class Figure:
    """One figure: where it is, as written, its value and the tolerance its shown precision allows."""

    path: str
    line: int
    text: str
    value: float
    tolerance: float
    percent: bool = False
    spread: Figure | None = None

    def __str__(self) -> str:
        shown = self.text + (f" ± {self.spread.text}" if self.spread else "")
        return f"{self.path}:{self.line}: {shown}"


_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?"
#: Units written against the number (``9.9×``, ``32.3%``) and units that may follow a space (``782 s``).
_ATTACHED_UNIT = r"%|×|x(?!\w)"
_SPACED_UNIT = r"(?:points?|ms|s|min|h|[GMK]i?B)(?!\w)|[MB](?![a-z])"
#: A number, optionally a range's first end (``35-`` of ``35-38%``), with an optional unit after it.
FIGURE = re.compile(
    rf"(?<![\w.,])(?P<sign>[+\-−]?)(?:(?P<low>{_NUMBER})[-–])?(?P<number>{_NUMBER})(?![\d.]\d)"
    rf"(?:(?P<unit>{_ATTACHED_UNIT})|\s?(?P<spaced_unit>{_SPACED_UNIT}))?"
)
#: What joins a mean to its spread: ``±``, or ``+-`` / ``+/-`` in ASCII text such as the YAML headers.
SPREAD_SIGN = re.compile(r"\s*(?:±|\+-|\+/-)\s*")
DURATION = re.compile(r"(?<![\w.])(?P<min>\d+) min (?P<sec>\d+) s(?![\w])")
#: Text that holds no figure: code, link targets, HTML comments, dates, versions, arXiv ids.
NOT_PROSE = [
    re.compile(r"```.*?```", re.S),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"\]\([^)]*\)"),
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    re.compile(r"\barXiv:? ?\d{4}\.\d{4,5}(?:v\d+)?", re.I),
    re.compile(r"\bPython ?[≥>=<]*=? ?\d+(?:\.\d+)+"),
    re.compile(r"\b\d+\.\d+\.\d+\S*"),
]
#: A word starting with a letter (after opening punctuation) that holds a digit: an identifier or label.
IDENTIFIER = re.compile(r"(?<!\S)[(\[{\"'*]*[A-Za-z_][^\s]*\d[^\s]*")
#: A hexadecimal word of 7+ characters with a letter and a digit: a commit hash.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def _blank(match: re.Match) -> str:
    """The match's text with everything but newlines blanked (line numbers stay right)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def figures_in(text: str, path: str) -> list[Figure]:
    """The figures of ``text`` (see the module docstring), each with its 1-based line number."""
    for pattern in (*NOT_PROSE, IDENTIFIER, COMMIT):
        text = pattern.sub(_blank, text)
    found: list[tuple[int, int, Figure]] = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for m in DURATION.finditer(text):
        seconds = 60 * int(m["min"]) + int(m["sec"])
        found.append((m.start(), m.end(), Figure(path, line_of(m.start()), m.group(0), float(seconds), 0.5)))
    text = DURATION.sub(_blank, text)
    for m in FIGURE.finditer(text):
        unit, number = m["unit"] or m["spaced_unit"], m["number"]
        mantissa = number.split("e")[0]
        decimal = "." in mantissa
        if "e" in number and not decimal:
            continue  # a setting such as a learning rate
        if not (decimal or unit):
            continue  # an integer count or setting
        ends = [number] + ([m["low"]] if m["low"] and unit == "%" else [])
        scale = {"M": 1e6, "B": 1e9}.get(unit or "", 1.0)
        for end in ends:
            value = float(end.replace(",", ""))
            digits = len(end.split("e")[0].partition(".")[2])
            exponent = int(end.split("e")[1]) if "e" in end else 0
            tolerance = 0.5 * 10 ** (exponent - digits)
            figure = Figure(
                path,
                line_of(m.start()),
                m.group(0).strip(),
                value * scale,
                tolerance * scale,
                unit in ("%", "point", "points"),
            )
            found.append((m.start(), m.end(), figure))
    found.sort(key=lambda item: item[0])
    # "mean ± spread": one figure whose spread must come from the same place as its mean
    figures: list[Figure] = []
    i = 0
    while i < len(found):
        start, end, figure = found[i]
        if i + 1 < len(found) and SPREAD_SIGN.fullmatch(text[end : found[i + 1][0]]):
            spread = found[i + 1][2]
            percent = figure.percent or spread.percent  # "26.0% ± 3.9%", "+5.6 ± 6.4 points"
            figure = replace(figure, percent=percent, spread=replace(spread, percent=percent))
            i += 1
        figures.append(figure)
        i += 1
    return figures


_JSON_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_JSON_SPREAD = re.compile(rf"({_JSON_NUMBER.pattern})\s*±\s*({_JSON_NUMBER.pattern})")


@dataclass
class MeasuredValues:
    """The numbers of the result files (absolute values, sorted) and the ``(value, spread)`` pairs a figure
    ``a ± b`` may come from: two numbers of the same JSON object, or ``a ± b`` written inside a string."""

    values: list[float]
    pairs: list[tuple[float, float]]

    @classmethod
    def read(cls, folder: Path = RESULTS, extra: list[dict] = ()) -> MeasuredValues:
        """Every number in ``folder/*.json``, ``benchmarks/data/*.json`` and the ``extra`` results (retired
        ones), plus the results' documented derivations: each estimator's difference from GRPO paired by seed
        (:func:`benchmarks.common.paired_differences`: mean and sample std, as the results page and the README
        state it) of every comparison's runs, ``1 / native_vs_openenv_N`` (OpenEnv's share of the native
        throughput) and ``X_bytes / 2**20`` (bytes stated in MiB)."""
        from benchmarks.common import paired_differences

        values: list[float] = []
        pairs: list[tuple[float, float]] = []

        def walk(obj) -> None:
            if isinstance(obj, dict) and _PROVENANCE_KEYS & obj.keys():
                obj = {k: v for k, v in obj.items() if k not in _PROVENANCE_KEYS}
            if isinstance(obj, str):
                values.extend(abs(float(n)) for n in _JSON_NUMBER.findall(obj))
                pairs.extend((abs(float(a)), abs(float(b))) for a, b in _JSON_SPREAD.findall(obj))
            elif isinstance(obj, dict):
                siblings = [abs(float(v)) for v in obj.values() if _is_number(v)]
                pairs.extend((a, b) for a in siblings for b in siblings)
                for key, value in obj.items():
                    walk(key)
                    walk(value)
                    if str(key).startswith("native_vs_openenv_") and _is_number(value) and value:
                        values.append(1 / abs(value))
                    if str(key).endswith("_bytes") and _is_number(value):
                        values.append(abs(value) / 2**20)
            elif isinstance(obj, list):
                for value in obj:
                    walk(value)
            elif _is_number(obj):
                values.append(abs(float(obj)))

        files = [*sorted(folder.glob("*.json")), *sorted(DATA.glob("*.json"))]
        for result in [*(json.loads(path.read_text()) for path in files), *extra]:
            walk(result)
            runs = result.get("runs") if isinstance(result, dict) else None
            if isinstance(runs, list) and any(r.get("estimator") == "grpo" for r in runs):
                for metric in ("success", "rl_tasks_success"):
                    walk(list(paired_differences(runs, metric).values()))
        return cls(sorted(values), sorted(pairs))

    def holds(self, figure: Figure) -> bool:
        """True when a value rounds to the figure (a percentage: as a fraction, or as the number itself) and,
        for ``a ± b``, a pair rounds to both."""
        scales = [1.0, 0.01] if figure.percent else [1.0]
        for scale in scales:
            target, tolerance = figure.value * scale, _slack(figure.tolerance * scale, figure.value * scale)
            if figure.spread is None:
                i = bisect.bisect_left(self.values, target - tolerance)
                if i < len(self.values) and self.values[i] <= target + tolerance:
                    return True
                continue
            spread_scale = 0.01 if figure.spread.percent and scale == 0.01 else 1.0
            spread = figure.spread.value * spread_scale
            spread_tolerance = _slack(figure.spread.tolerance * spread_scale, spread)
            i = bisect.bisect_left(self.pairs, (target - tolerance, -math.inf))
            while i < len(self.pairs) and self.pairs[i][0] <= target + tolerance:
                if abs(self.pairs[i][1] - spread) <= spread_tolerance:
                    return True
                i += 1
        return False


#: What a result was measured with, not what it measured (the environment record: packages, torch's build
#: text, CPU flags, platform, commit): its version numbers must not make a stale figure pass by coincidence.
#: The machine's load average stays: the results page shows it.
_PROVENANCE_KEYS = {
    "environment",
    "git",
    "packages",
    "torch_build",
    "cpu_flags",
    "cpu_model",
    "platform",
    "python",
    "weights_sha256",
}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _slack(tolerance: float, target: float) -> float:
    """The rounding tolerance plus room for the binary representation of the shown value."""
    return tolerance + 1e-9 * max(1.0, abs(target))


def config_header(path: Path) -> str:
    """The leading comment block of a YAML config (lines up to the first that is not a comment)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


#: docs pages that state measured figures.
CLAIM_DOCS = ("quickstart.md", "results.md", "training.md", "async_rollouts.md", "real_models.md")


def claim_sources() -> list[tuple[str, str]]:
    """``(path relative to the repository, text)`` of every place whose figures must be measured."""
    sources = [("README.md", (ROOT / "README.md").read_text())]
    sources += [
        (str(p.relative_to(ROOT)), config_header(p)) for p in sorted((ROOT / "configs").glob("*.yaml"))
    ]
    sources.append(("benchmarks/README.md", (ROOT / "benchmarks" / "README.md").read_text()))
    # the README's details moved to these pages; their figures are claims like the README's
    sources += [(f"docs/{name}", (ROOT / "docs" / name).read_text()) for name in CLAIM_DOCS]
    return sources


def retired_results(sources: list[tuple[str, str]]) -> list[dict]:
    """The retired result files the sources cite (:data:`RETIRED`), read from the commits that hold them."""
    import subprocess

    cited = sorted({match.groups() for _, text in sources for match in RETIRED.finditer(text)})
    if cited and subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("retired results are read from the git history: not a git checkout")
    results = []
    for name, commit in cited:
        shown = subprocess.run(
            ["git", "show", f"{commit}:benchmarks/results/{name}"], cwd=ROOT, capture_output=True, text=True
        )
        assert shown.returncode == 0, (
            f"no benchmarks/results/{name} at commit {commit}: {shown.stderr.strip()}"
        )
        results.append(json.loads(shown.stdout))
    return results


@pytest.fixture(scope="module")
def measured_values() -> MeasuredValues:
    return MeasuredValues.read(extra=retired_results(claim_sources()))


@pytest.mark.parametrize("path,text", claim_sources(), ids=[p for p, _ in claim_sources()])
def test_every_figure_is_a_measured_value(path, text, measured_values):
    unmeasured = [f for f in figures_in(text, path) if not measured_values.holds(f)]
    assert not unmeasured, f"{len(unmeasured)} figures in {path} are in no benchmarks/results/*.json:\n" + (
        "\n".join(map(str, unmeasured))
    )


def test_figure_rule():
    text = (
        "Held-out 26.0% ± 3.9% → 32.3% (6.5-7.7%), 13 min 3 s wall, 782 s CPU, 1.2 GB, 9.9× faster, the "
        "8.8M-parameter model; 3 seeds, 30 iterations at `3e-4` and 3e-4, 4 groups × 4, Qwen2.5-1.5B/7B, "
        "FloorPlan308, (n=3), Python ≥ 3.10, torch 2.13.0, 2026-11-30, arXiv 2505.10978 v3, commit "
        "`6f9924977515` and 4937f8232d5d, +0.300 ± 0.000, 0.260 +- 0.039, 1.234e+06\n```\nprogpo train 0.5"
        "\n```\n0.25"
    )
    figures = figures_in(text, "t")
    assert [(str(f), f.value) for f in figures] == [
        ("t:1: 26.0% ± 3.9%", 26.0),
        ("t:1: 32.3%", 32.3),
        ("t:1: 6.5-7.7%", 7.7),
        ("t:1: 6.5-7.7%", 6.5),
        ("t:1: 13 min 3 s", 783.0),
        ("t:1: 782 s", 782.0),
        ("t:1: 1.2 GB", 1.2),
        ("t:1: 9.9×", 9.9),
        ("t:1: 8.8M", 8.8e6),
        ("t:1: +0.300 ± 0.000", 0.3),
        ("t:1: 0.260 ± 0.039", 0.26),
        ("t:1: 1.234e+06", 1234000.0),
        ("t:5: 0.25", 0.25),
    ]
    by_text = {f.text: f for f in figures}
    measured = MeasuredValues(
        values=sorted([0.2604, 0.323, 783.4, 0.0771, 1.23e6, 8_785_792.0]),
        pairs=sorted([(0.2604, 0.0392), (0.3, 0.0004), (0.0392, 0.2604)]),
    )
    assert measured.holds(by_text["26.0%"]) and measured.holds(by_text["32.3%"])
    assert measured.holds(by_text["+0.300"]) and measured.holds(by_text["8.8M"])
    assert measured.holds(by_text["13 min 3 s"]) and not measured.holds(by_text["782 s"])
    assert not measured.holds(by_text["1.234e+06"])  # 1.230e+06 is not 1.234e+06
    assert not measured.holds(by_text["0.25"])
    # a spread must be the mean's partner: 26.0% with another spread is not measured
    assert not measured.holds(replace(by_text["26.0%"], spread=by_text["32.3%"]))
    # a retired result is cited with the commit that holds it; its name and commit are code, not figures
    cited = "measured once (`kernel_paths.json` of commit `f598421e92e1`): 1.5 s"
    assert RETIRED.findall(cited) == [("kernel_paths.json", "f598421e92e1")]
    assert [f.text for f in figures_in(cited, "t")] == ["1.5 s"]


def test_openenv_share_is_read_as_the_reciprocal_of_native_vs_openenv(tmp_path):
    hosting = {"results": {"webshop": {"native_vs_openenv_32": 1.25}}}
    (tmp_path / "hosting.json").write_text(json.dumps(hosting))
    measured = MeasuredValues.read(tmp_path)
    holds = {f.text: measured.holds(f) for f in figures_in("0.80× and 0.79×", "t")}
    assert holds == {"0.80×": True, "0.79×": False}


def test_bytes_are_read_in_mib_too(tmp_path):
    (tmp_path / "soak.json").write_text(json.dumps({"max_connection_bytes": 567_000_000}))
    measured = MeasuredValues.read(tmp_path)
    holds = {f.text: measured.holds(f) for f in figures_in("541 MiB and 540 MiB", "t")}
    assert holds == {"541 MiB": True, "540 MiB": False}


def _page_text_nodes(path: Path, functions: set[str] | None = None) -> list[ast.Constant]:
    """The string constants of ``path`` that can reach the results page, docstrings left out: every one when
    ``functions`` is None (the page's generator), else those of ``SPECS`` and of the named functions and the
    module's functions they call (a benchmark's renderer beside its measuring code)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    roots: list[ast.AST] = [tree]
    if functions is not None:
        defined = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        todo, seen = list(functions), set()
        while todo:
            name = todo.pop()
            if name in seen or name not in defined:
                continue
            seen.add(name)
            todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name) and n.id in defined]
        specs = [n for n in tree.body if isinstance(n, ast.Assign) and "SPECS" in ast.unparse(n.targets[0])]
        roots = [defined[name] for name in seen] + specs
    return [
        node
        for root in roots
        for node in ast.walk(root)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_results_page_generator_types_no_figure():
    """The results page is generated (its figures are read from the result files, and ``report.py --check``
    keeps it current); a figure typed into one of the generator's strings, a benchmark's spec, its renderer
    or its paragraph of ``benchmarks/measures.md`` would bypass that."""
    from benchmarks import report

    renderers: dict[str, set[str]] = {}
    for spec in report.BENCHMARKS:
        functions = renderers.setdefault(spec.script, set())
        if spec.render is not None:
            functions.add(spec.render.__name__)
    sources = [("benchmarks/report.py", None), *sorted(renderers.items())]
    typed = [
        f"{rel}:{node.lineno}: {figure.text}"
        for rel, functions in sources
        for node in _page_text_nodes(ROOT / rel, functions)
        for figure in figures_in(node.value, rel)
    ]
    measures = "benchmarks/measures.md"
    typed += [f"{measures}:{f.line}: {f.text}" for f in figures_in((ROOT / measures).read_text(), measures)]
    assert not typed, "figures typed into the results page's generator:\n" + "\n".join(typed)


def test_results_page_is_current():
    from benchmarks import report

    assert report.main(["--check"]) == 0, "benchmarks/README.md is stale: run python benchmarks/report.py"
