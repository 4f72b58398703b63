"""Render ``benchmarks/README.md``, the results page, from the JSON files in ``benchmarks/results/``.

Every suite declares its result files (:class:`benchmarks.harness.Benchmark`: how to run each, its renderer)
in its module's ``SPECS``; :func:`discover` finds them (:data:`BENCHMARKS`), with what each measures from
``benchmarks/measures.md``. For each one the page shows the latest results as Markdown tables built from the
JSON (nothing is typed in by hand: a benchmark without a result file says "not run yet"), the command recorded
in the JSON, the machine it ran on, and its plot. The papers' published numbers (``data/published.json``, data
no command makes: copied from the tables ``docs/algorithms.md`` §9 cites) follow, with what differs in ours.
No figure is typed into a renderer: prose states numbers only as read from a file (``tests/test_claims.py``
checks the page).

Run: ``python benchmarks/report.py`` (or ``progpo bench --report-only``); ``--check`` exits 1 when the page on
disk is not what the results render to.

Example:
    >>> page = render_page(Path("/nonexistent"), Path("/nonexistent"))
    >>> "not run yet" in page and "`data/published.json` is missing" in page
    True
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import sys
from pathlib import Path

from benchmarks.harness import RESULTS_DIR, ROOT, Benchmark
from benchmarks.lib.markdown import fmt, markdown_table, section_body

PAGE = ROOT / "benchmarks" / "README.md"
MEASURES = ROOT / "benchmarks" / "measures.md"
DATA_DIR = ROOT / "benchmarks" / "data"
#: The page's order of the suites (the headline claims first); a module that declares ``SPECS`` and is not
#: listed here follows them, in name order.
PAGE_ORDER = ("bench_training", "bench_estimators", "bench_envs", "bench_hosting", "soak", "bench_eval")


def declares_specs(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``SPECS`` at its top level (read, not imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    targets = (target for node in tree.body if isinstance(node, ast.Assign) for target in node.targets)
    return any(isinstance(target, ast.Name) and target.id == "SPECS" for target in targets)


def read_measures(text: str) -> dict[str, str]:
    """``name -> paragraph`` of a measures file's ``text``: each ``## name`` heading's text, its lines joined.

    Example:
        >>> read_measures("# What each measures\\n\\nIntro.\\n\\n## demo\\n\\nWhat it\\nmeasures.\\n")
        {'demo': 'What it measures.'}
    """
    sections = (s.partition("\n") for s in text.split("\n## ")[1:])
    return {name.strip(): " ".join(paragraph.split()) for name, _, paragraph in sections}


def discover(folder: Path = ROOT / "benchmarks") -> list[Benchmark]:
    """Every result file's spec: the ``SPECS`` of each module of ``folder`` that declares them, in
    :data:`PAGE_ORDER`, with its paragraph of :data:`MEASURES` (empty when it has none)."""
    names = [path.stem for path in sorted(folder.glob("*.py")) if declares_specs(path)]
    ordered = [name for name in PAGE_ORDER if name in names] + [n for n in names if n not in PAGE_ORDER]
    specs = ((name, spec) for name in ordered for spec in importlib.import_module(f"benchmarks.{name}").SPECS)
    measures = read_measures(MEASURES.read_text(encoding="utf-8"))
    return [
        dataclasses.replace(spec, script=f"benchmarks/{name}.py", measures=measures.get(spec.name, ""))
        for name, spec in specs
    ]


BENCHMARKS: list[Benchmark] = discover()


def published_section(data_dir: Path) -> str:
    """The papers' tables and claims from ``data/published.json``, and what differs in ours."""
    head = "## Published numbers (the papers) and ours"
    try:
        data = json.loads((data_dir / "published.json").read_text())
    except (OSError, json.JSONDecodeError):
        return f"{head}\n\n**`data/published.json` is missing or unreadable.**"
    peer = data.get("progpo_third_party_no_exact_prefix_peer", {})
    products = data.get("paper_webshop_products")
    tables = [
        f"**{t['title']}**\n\n" + markdown_table(t["header"], t["rows"]) for t in data.get("tables", [])
    ]
    return "\n\n".join(
        [
            head,
            f"{data.get('about', '')} Paper setting ({data.get('paper_setting', '—')}).",
            *tables,
            f'G2PO (arXiv 2606.22995): only the abstract\'s claim ("{data.get("g2po_abstract_claim", "—")}") '
            "was recovered. ProGPO (arXiv 2607.04242): no numbers recovered; the only statistic attributed "
            "to it (third party) is the share of steps with no exact-prefix peer: "
            + ", ".join(f"{fmt(v)} on {env}" for env, v in peer.items())
            + ".",
            "**What differs in ours.** The comparison here trains a tiny policy (the quickstart's "
            "Qwen2-shaped model, or a small pretrained model on GPU), not Qwen2.5-1.5B/7B; on generated "
            "ALFWorld games and a generated WebShop catalog, not the papers' ALFRED-derived games and "
            + (f"{products / 1e6:.2f}M-product shop" if products else "full shop")
            + "; on the CPU with two of ALFWorld's six task types (trained in four bedrooms, evaluated in "
            "the unseen one; the `gpu` setting has all six and the four unseen rooms), because two task "
            "types in small rooms are what a randomly initialised policy learns on 2 cores in minutes "
            "(`configs/quickstart.yaml` says why); for a few iterations with a few small groups, not the "
            "papers' setting above; with a two-stage expert warm start. Absolute success rates are "
            "therefore not comparable with the papers' — only the ordering of estimators at equal compute "
            "speaks to the papers' claims. ProGPO and ProGPO-coverage are reconstructed from the abstract "
            "(no code or tables were available).",
        ]
    )


def machine_line(data: dict) -> str:
    m = data.get("machine")
    if not isinstance(m, dict):
        return "machine: not recorded"
    keys = [k for k in ("device", "gpu", "cpu_count", "python", "platform", "torch") if k in m]
    load = next((m[k] for k in m if k.startswith("load")), None)
    return "machine: " + ", ".join(f"{k} {fmt(m[k])}" for k in keys) + (f", load {fmt(load)}" if load else "")


def render_benchmark(bench: Benchmark, results_dir: Path) -> str:
    path = results_dir / f"{bench.name}.json"
    quick = f" · quick: `python {bench.script} {' '.join(bench.quick_args)}`" if bench.quick else ""
    head = [f"### {bench.name}", bench.measures, f"Run: `{bench.command}`{quick}"]
    if not (ROOT / bench.script).exists():
        head.append("*Script not in the repository yet.*")
    if not path.exists():
        return "\n\n".join([*head, "**Results: not run yet.**"])
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return "\n\n".join([*head, f"**Results: unreadable `{path.name}` ({exc}).**"])
    if not isinstance(data, dict):
        return "\n\n".join([*head, f"**Results: `{path.name}` is not a JSON object.**"])
    recorded = f" · recorded command: `{data['command']}`" if data.get("command") else ""
    if data.get("command_as_run"):  # measured before the benchmark moved into its suite
        recorded += f" (measured as `{data['command_as_run']}`)"
    info = [f"Result file: `results/{path.name}`{recorded}", machine_line(data)]
    if isinstance(data.get("git"), dict) and data["git"].get("commit"):
        dirty = " (with local changes)" if data["git"].get("dirty") else ""
        info.append(f"commit: `{data['git']['commit'][:12]}`{dirty}")
    plot = results_dir / f"{bench.name}.png"
    figures = [f"![{plot.name}](results/{plot.name})"] if plot.exists() else []
    return "\n\n".join([*head, " · ".join(info), section_body(bench.render, data), *figures])


def render_page(results_dir: Path = RESULTS_DIR, data_dir: Path = DATA_DIR) -> str:
    """The whole results page as Markdown."""
    known = {b.name for b in BENCHMARKS}
    unknown = (
        sorted(p.stem for p in results_dir.glob("*.json") if p.stem not in known)
        if results_dir.is_dir()
        else []
    )
    extra = [
        Benchmark(name, command="—", measures="(a result file no benchmark declares)") for name in unknown
    ]
    contents = "\n".join(f"- [{b.name}](#{b.name}) — `{b.script}`" for b in BENCHMARKS)
    sections = [
        "# Benchmarks and results",
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json; edit the script, not this "
        "page. -->",
        "Every benchmark of the project, its latest results and the machine they ran on. Numbers come only "
        "from the JSON files in `results/`, each recording the command that reruns it; a benchmark that has "
        "not written one is shown as *not run yet*. The benchmarks are suites, one per thing the product "
        "does (`python benchmarks/<suite>.py PART`); `progpo bench` runs the quick version of every one "
        "(its files go to `runs/bench_quick/`, never over these) and regenerates this page (`progpo bench "
        "--report-only` only regenerates it).",
        f"## Contents\n\n{contents}",
        "## Results",
        *(render_benchmark(b, results_dir) for b in [*BENCHMARKS, *extra]),
        published_section(data_dir),
    ]
    return "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of result JSON files")
    parser.add_argument("--out", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from the rendering")
    args = parser.parse_args(argv)
    page = render_page(args.results)
    if args.check:
        if (args.out.read_text() if args.out.exists() else "") != page:
            print(f"{args.out} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
