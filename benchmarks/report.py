"""Render ``benchmarks/README.md``, the results page, from the JSON files in ``benchmarks/results/``.

Every benchmark declares itself (:class:`benchmarks.harness.Benchmark`: what it measures, how to run it, its
result file, its renderer) in its module's ``SPECS``; :func:`discover` finds them (:data:`BENCHMARKS`). For
each one the page shows the latest results as Markdown tables built from the JSON (nothing is typed in by
hand: a benchmark without a result file says "not run yet"), the command recorded in the JSON (or the
benchmark's command), the machine it ran on, and its plots. The papers' published numbers
(``results/published.json``, copied from the tables ``docs/algorithms.md`` §9 cites) are shown next to the
project's estimator comparison, with what differs. No figure is typed into a renderer: prose states numbers
only as read from a result file (``tests/test_claims.py`` checks the page).

Run: ``.venv/bin/python -m benchmarks.report`` (or ``progpo bench --report-only``); ``--check`` exits 1 when
the page on disk is not what the results render to.

Example:
    >>> page = render_page(Path("/nonexistent"))
    >>> "not run yet" in page and "`results/published.json` is missing" in page
    True
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from pathlib import Path

from benchmarks.harness import Benchmark
from benchmarks.lib.markdown import fmt, generic_tables, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
PAGE = ROOT / "benchmarks" / "README.md"
#: The page's order of the benchmark modules (the headline claims first); a module that declares ``SPECS``
#: and is not listed here follows them, in name order.
PAGE_ORDER = (
    "quickstart",
    "bench_async_rollouts",
    "progpo_ablation",
    "bench_kernel_paths",
    "compare_estimators",
    "credit_diagnostics",
    "bench_advantages",
    "bench_alfworld",
    "bench_webshop",
    "bench_webshop_data",
    "bench_eval",
    "bench_eval_concurrency",
    "bench_hosting",
    "bench_openenv",
    "bench_training",
    "bench_update_memory",
    "bench_constrained",
    "memory_budget",
    "bench_weight_sync",
)


def declares_specs(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``SPECS`` at its top level (read, not imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    targets = (target for node in tree.body if isinstance(node, ast.Assign) for target in node.targets)
    return any(isinstance(target, ast.Name) and target.id == "SPECS" for target in targets)


def discover(folder: Path = ROOT / "benchmarks") -> list[Benchmark]:
    """Every benchmark's spec: the ``SPECS`` of each module of ``folder`` that declares them, in
    :data:`PAGE_ORDER`."""
    names = [path.stem for path in sorted(folder.glob("*.py")) if declares_specs(path)]
    ordered = [name for name in PAGE_ORDER if name in names] + [n for n in names if n not in PAGE_ORDER]
    return [spec for name in ordered for spec in importlib.import_module(f"benchmarks.{name}").SPECS]


BENCHMARKS: list[Benchmark] = discover()

# ------------------------------------------------------------------------------------------------------------
# Published numbers (results/published.json: copied from the papers' tables, with their sources in
# docs/algorithms.md §9)
# ------------------------------------------------------------------------------------------------------------

#: The papers' numbers: a committed file beside the results, so that no figure on the page is typed in here.
PUBLISHED = "published"


def _tiny_parameters(results_dir: Path) -> str:
    """The quickstart's tiny policy's size as the constrained-decoding benchmark measured it ("" unknown)."""
    try:
        data = json.loads((results_dir / "constrained.json").read_text())
        tiny = next(r for r in data["results"] if r.get("model") == "tiny")
        return f"{tiny['parameters'] / 1e6:.1f}M-parameter "
    except (OSError, json.JSONDecodeError, KeyError, StopIteration, TypeError):
        return ""


def published_section(results_dir: Path) -> str:
    """The papers' tables and claims from ``results/published.json``, and what differs in ours."""
    path = results_dir / f"{PUBLISHED}.json"
    head = "## Published numbers (the papers) and ours"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return f"{head}\n\n**`results/{path.name}` is missing or unreadable.**"
    peer = data.get("progpo_third_party_no_exact_prefix_peer", {})
    products = data.get("paper_webshop_products")
    return "\n\n".join(
        [
            head,
            f"{data.get('about', '')} Paper setting ({data.get('paper_setting', '—')}).",
            *(
                f"**{table['title']}**\n\n" + markdown_table(table["header"], table["rows"])
                for table in data.get("tables", [])
            ),
            f'G2PO (arXiv 2606.22995): only the abstract\'s claim ("{data.get("g2po_abstract_claim", "—")}") '
            "was recovered. ProGPO (arXiv 2607.04242): no numbers recovered; the only statistic attributed "
            "to it (third party) is the share of steps with no exact-prefix peer: "
            + ", ".join(f"{fmt(v)} on {env}" for env, v in peer.items())
            + " — compare with the credit-diagnostics table above.",
            "**What differs in ours.** The comparison here trains a tiny policy (the quickstart's "
            f"{_tiny_parameters(results_dir)}Qwen2-shaped model, or a small pretrained model on GPU), not "
            "Qwen2.5-1.5B/7B; on generated ALFWorld games and a generated WebShop catalog, not the papers' "
            "ALFRED-derived games and "
            + (f"{products / 1e6:.2f}M-product shop" if products else "full shop")
            + "; on the CPU with two of ALFWorld's six task types (trained in four bedrooms, evaluated in "
            "the unseen one; the `gpu` setting has all six and the four unseen rooms), because two task "
            "types in small rooms are what a randomly initialised policy learns on 2 cores in minutes "
            "(`configs/quickstart.yaml` says why); for a few iterations with a few small groups, not the "
            "papers' setting above; with a two-stage expert warm start. Absolute success rates are therefore "
            "not comparable with the papers' — only the ordering of estimators at equal compute, and the "
            "diagnostics, speak to the papers' claims. ProGPO and ProGPO-coverage are reconstructed from the "
            "abstract (no code or tables were available).",
        ]
    )


def machine_line(data: dict) -> str:
    m = data.get("machine")
    if not isinstance(m, dict):
        return "machine: not recorded"
    keys = [k for k in ("device", "gpu", "cpu_count", "python", "platform", "torch") if k in m]
    load = next((m[k] for k in m if k.startswith("load")), None)
    text = ", ".join(f"{k} {fmt(m[k])}" for k in keys)
    if load is not None:
        text += f", load {fmt(load)}"
    return "machine: " + text


def render_benchmark(bench: Benchmark, results_dir: Path) -> str:
    path = results_dir / f"{bench.name}.json"
    head = [
        f"### {bench.name}",
        bench.measures,
        f"Run: `{bench.command}`"
        + (
            f" · quick: `python {bench.script} {' '.join(bench.quick_args)}`"
            if bench.quick_args is not None
            else ""
        ),
    ]
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
    body = None
    if bench.render is not None:
        try:
            body = bench.render(data)
        except (KeyError, TypeError, AttributeError, ValueError):
            body = None  # another shape than the curated layout expects: show every number generically
    if body is None:
        body = generic_tables(data)
    recorded = data.get("command")
    info = [
        f"Result file: `results/{path.name}`" + (f" · recorded command: `{recorded}`" if recorded else ""),
        machine_line(data),
    ]
    if isinstance(data.get("git"), dict) and data["git"].get("commit"):
        info.append(
            f"commit: `{data['git']['commit'][:12]}`"
            + (" (with local changes)" if data["git"].get("dirty") else "")
        )
    plot = results_dir / f"{bench.name}.png"
    figures = [f"![{plot.name}](results/{plot.name})"] if plot.exists() else []
    return "\n\n".join([*head, " · ".join(info), body, *figures])


def render_page(results_dir: Path = RESULTS_DIR) -> str:
    """The whole results page as Markdown."""
    known = {b.name for b in BENCHMARKS}
    extra = (
        sorted(p.stem for p in results_dir.glob("*.json") if p.stem not in known and p.stem != PUBLISHED)
        if results_dir.is_dir()
        else []
    )
    sections = [
        "# Benchmarks and results",
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json; edit the script, not this "
        "page. -->",
        "Every benchmark of the project, its latest results and the machine they ran on. Numbers come only "
        "from "
        "the JSON files in `results/`; a benchmark that has not written one is shown as *not run yet*. "
        "`progpo bench` runs the quick version of every benchmark and regenerates this page "
        "(`progpo bench --report-only` only regenerates it). Quick runs overwrite the result files: the "
        "recorded "
        "command says which setting produced the numbers shown.",
        "## Contents\n\n" + "\n".join(f"- [{b.name}](#{b.name}) — `{b.script}`" for b in BENCHMARKS),
        "## Results",
        *(render_benchmark(b, results_dir) for b in BENCHMARKS),
        *(
            render_benchmark(
                Benchmark(
                    name,
                    f"benchmarks/bench_{name}.py",
                    "(not described in report.py yet)",
                    f"python benchmarks/bench_{name}.py",
                ),
                results_dir,
            )
            for name in extra
        ),
        published_section(results_dir),
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
        current = args.out.read_text() if args.out.exists() else ""
        if current != page:
            print(f"{args.out} is out of date: run python -m benchmarks.report", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
