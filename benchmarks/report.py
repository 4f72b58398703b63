"""Render ``benchmarks/README.md``, the results page, from the JSON files in ``benchmarks/results/``.

Every benchmark of the project is listed in :data:`BENCHMARKS` (what it measures, how to run it, its result
file). For each one the page shows the latest results as Markdown tables built from the JSON (nothing is typed
in by hand: a benchmark without a result file says "not run yet"), the command recorded in the JSON (or the
benchmark's command), the machine it ran on, and its plots. The papers' published numbers
(``results/published.json``, copied from the tables ``docs/algorithms.md`` §9 cites) are shown next to the
project's estimator comparison, with what differs. No figure is typed into this script: prose states numbers
only as read from a result file (``tests/test_claims.py`` checks the page).

Run: ``.venv/bin/python benchmarks/report.py`` (or ``progpo bench --report-only``); ``--check`` exits 1 when
the page on disk is not what the results render to.

Example:
    >>> page = render_page(Path("/nonexistent"))
    >>> "not run yet" in page and "`results/published.json` is missing" in page
    True
"""

from __future__ import annotations

import argparse
import json
import math
import re
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
                    b["exact_prefix_peer_fraction"],
                    paper.get(source),
                    b["anchor_peer_fraction"],
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
                "steps with an exact-prefix peer",
                "paper: steps without one",
                "steps with an anchor peer",
            ],
            summary_rows,
        )
    )
    parts.append(_credit_summary(data))
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


#: The diagnostics where higher is better (more steps with a step signal, advantages that follow progress or
#: the expert, step signals of the right sign): the summary ranks every estimator on each.
RANKED_DIAG_COLUMNS = DIAG_COLUMNS[:5]
#: The estimator the summary follows beside each column's leader.
FOLLOWED_ESTIMATOR = "progpo"


def _credit_summary(data: dict) -> str:
    """Per batch and per ranked column: the leading estimator and the followed one's value and rank, so that
    no column is quoted without the others."""
    rows = []
    for source, batches in data["sources"].items():
        for label, entry in batches.items():
            if label == "error":
                continue
            cells = []
            for key, _ in RANKED_DIAG_COLUMNS:
                values = {n: m[key] for n, m in entry["estimators"].items() if m.get(key) is not None}
                if not values:
                    cells.append("—")
                    continue
                best = max(values.values())
                leaders = " = ".join(n for n, v in values.items() if v == best)
                followed = values.get(FOLLOWED_ESTIMATOR)
                # competition ranking: 1 + the number of estimators strictly ahead
                rank = 1 + sum(v > followed for v in values.values()) if followed is not None else None
                mine = (
                    f"; {FOLLOWED_ESTIMATOR} {_fmt(followed)} ({rank}/{len(values)})"
                    if followed is not None and followed != best
                    else ""
                )
                cells.append(f"{leaders} {_fmt(best)}{mine}")
            rows.append([source, label, *cells])
    return (
        f"**Summary, every ranked column** (higher is better): per batch, the leading estimator and "
        f"{FOLLOWED_ESTIMATOR}'s value and rank among the estimators with a value.\n\n"
        + markdown_table(["source", "batch", *(t for _, t in RANKED_DIAG_COLUMNS)], rows)
    )


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
    from benchmarks.common import paired_differences

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


#: An absolute path up to a ``runs/`` folder (``/any/checkout/runs/...``): where a result was recorded.
_ABSOLUTE_RUNS_PREFIX = re.compile(r"/[^\s'=]*?/runs/")


def _reproduce_commands(data: dict) -> str:
    """How to rerun one number of the comparison: its env's warm start, then the run (paths shown relative to
    the repository root, where the commands run)."""
    runs = [r for r in data.get("runs", []) if r.get("command")]
    if not runs:
        return ""

    def shown(command: str) -> str:
        # the folders were recorded as absolute paths of the machine that ran them: show them from the root
        return f"`{_ABSOLUTE_RUNS_PREFIX.sub('runs/', command)}`"

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


def _success(entry: dict) -> str:
    """``mean ± spread`` of one evaluation of the quickstart's result (spread over sampling seeds)."""
    spread = entry.get("spread")
    return _fmt(entry["success"]) + (f" ± {_fmt(spread)}" if spread is not None else "")


def _over_seeds(stats: dict) -> str:
    return f"{_fmt(stats['mean'])} ± {_fmt(stats['std'])}"


QUICKSTART_EVALUATIONS = (("held_out", "held-out tasks"), ("rl_tasks", "RL's own tasks"))


def render_progpo_ablation(data: dict) -> str:
    """The ablation's three tables: diagnostics on both batch kinds (every column), then RL vs GRPO."""
    from benchmarks.progpo_ablation import tables

    parts = [
        "First reading: "
        + ", ".join(f"`{k}={v}`" for k, v in data["first_reading"].items())
        + ". Current defaults: "
        + ", ".join(f"`{k}={v}`" for k, v in data["current_defaults"].items())
        + " (`success_potential=None`: 0 for the step-return target). Each cell: mean ± sample std over "
        f"seeds (diagnostics: batch seeds {_fmt(data['config']['seeds'])}, each the mean over the noise "
        "levels; policy: one rollout file per recording seed; RL: RL seeds)."
    ]
    parts += [f"**{title}**\n\n" + markdown_table(header, rows) for title, header, rows in tables(data)]
    return "\n\n".join(parts)


def render_quickstart(data: dict) -> str:
    seeds = data["seeds"]
    intro = (
        f"Seed {seeds[0]['seed']} is the README's main job ({data.get('main_job', '—')}); the other seeds "
        "run RL from its warm start."
    )
    return _quickstart_runs(data, intro)


def _quickstart_runs(data: dict, intro: str) -> str:
    """A quickstart result's runs: success before → after RL per seed and over seeds, cost, commands."""
    seeds = data["seeds"]
    setting = seeds[0]["setting"]
    parts = [
        intro + " Success before → after RL: mean ± spread over the evaluation's "
        f"sampling seeds ({_fmt(setting.get('eval_seeds'))} seeds × {_fmt(setting.get('eval_num_tasks'))} "
        f"held-out tasks; RL's own pool of {_fmt(setting.get('rl_task_pool'))} tasks), "
        f"{_fmt(setting.get('iterations'))} {setting.get('algo')} iterations; last row: mean ± sample std "
        "over RL seeds."
    ]
    rows = []
    for s in seeds:
        cells = [
            f"{_success(s[name]['before'])} → {_success(s[name]['after'])}" if name in s else "—"
            for name, _ in QUICKSTART_EVALUATIONS
        ]
        rows.append(
            [
                s["seed"],
                *cells,
                *(f"{s[name]['change']:+.4g}" if name in s else "—" for name, _ in QUICKSTART_EVALUATIONS),
            ]
        )
    over = data["over_seeds"]
    rows.append(
        [
            f"mean ± std (n = {len(seeds)})",
            *(
                f"{_over_seeds(over[name]['before'])} → {_over_seeds(over[name]['after'])}"
                if name in over
                else "—"
                for name, _ in QUICKSTART_EVALUATIONS
            ),
            *(
                _over_seeds(over[name]["change"]) if name in over else "—"
                for name, _ in QUICKSTART_EVALUATIONS
            ),
        ]
    )
    parts.append(
        markdown_table(
            [
                "RL seed",
                *(f"{title}: before → after" for _, title in QUICKSTART_EVALUATIONS),
                *(f"{title}: change" for _, title in QUICKSTART_EVALUATIONS),
            ],
            rows,
        )
    )
    for name, title in QUICKSTART_EVALUATIONS:
        if name in over:
            parts.append(
                f"Success on {title} rose in {over[name]['seeds_where_it_rose']} and fell in "
                f"{over[name]['seeds_where_it_fell']} of {len(seeds)} RL seeds."
            )
    cost = data.get("seed0_resources")
    parts.append(
        "Cost of seed 0's run: "
        + (
            f"{_fmt(cost['wall_s'])} s wall, {_fmt(cost['user_cpu_s'])} s user CPU, "
            f"{_fmt(cost['system_cpu_s'])} s system CPU, {_fmt(cost['peak_rss_gb'])} GB peak RSS."
            if cost
            else "not measured (the run was not started by `benchmarks/quickstart.py`)."
        )
    )
    commands = [s["command"] for s in seeds if s.get("command")]
    if commands:
        parts.append("Commands (from the repository root):\n" + "\n".join(f"- `{c}`" for c in commands))
    return "\n\n".join(parts)


def render_quickstart_async(data: dict) -> str:
    """The quickstart with other settings (``--set``), and its success after RL beside the baseline's."""
    comparison = (data.get("baseline") or {}).get("comparison") or {}
    parts = [
        "Settings over the quickstart's own: "
        + (", ".join(f"`{c}`" for c in _set_overrides(data.get("command", ""))) or "none recorded")
        + ". Every seed runs with them"
        + (
            ", RL starting from the default job's warm start (`--warm-start-from`: it is deterministic)."
            if "--warm-start-from" in data.get("command", "")
            else " (seed 0 includes the warm start)."
        )
    ]
    if comparison:
        rows = [
            [
                title,
                _over_seeds(entry["after"]),
                _over_seeds(entry["baseline_after"]),
                f"{entry['baseline_after']['min']:.4g} … {entry['baseline_after']['max']:.4g}",
                f"{entry['difference_of_means']:+.4g}",
                entry["within_range"],
                entry["within_two_std"],
            ]
            for name, title in QUICKSTART_EVALUATIONS
            if (entry := comparison.get(name))
        ]
        parts.append(
            f"Success after RL against `{data['baseline']['file']}` (mean ± sample std over RL seeds):\n\n"
            + markdown_table(
                [
                    "evaluation",
                    "these runs",
                    "baseline",
                    "baseline's seed range",
                    "difference of means",
                    "within the range",
                    "within 2 std",
                ],
                rows,
            )
        )
    parts.append(_quickstart_runs(data, "Each RL seed runs with the settings above."))
    return "\n\n".join(parts)


def _set_overrides(command: str) -> list[str]:
    """The ``--set KEY=VALUE`` overrides of a recorded ``quickstart.py`` command."""
    words = command.split()
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--set"]


def render_async_rollouts(data: dict) -> str:
    """Lock-step vs per-episode rollout throughput, iteration wall time by staleness, the replay model."""
    parts = []
    rows = []
    for engine in ("transformers", "vllm"):
        part = data.get(engine) or {}
        for workload in ("alfworld_quickstart", "webshop_preset"):
            w = part.get(workload)
            if not w:
                continue
            rows.append(
                [
                    engine,
                    workload,
                    w["lockstep"]["env_steps_per_s"],
                    w["async"]["env_steps_per_s"],
                    w["env_steps_speedup"],
                    w["lockstep"]["tokens_per_s"],
                    w["async"]["tokens_per_s"],
                    w["tokens_speedup"],
                    f"{w['episodes_agreeing']}/{w['lockstep']['episodes']}",
                ]
            )
    if rows:
        parts.append(
            "**Rollout throughput** (the same episodes; per-episode at `rollout.max_staleness=0`; "
            "over the rollout's wall time):\n\n"
            + markdown_table(
                [
                    "engine",
                    "workload",
                    "lock-step env steps/s",
                    "per-episode env steps/s",
                    "env steps speed-up",
                    "lock-step tokens/s",
                    "per-episode tokens/s",
                    "tokens speed-up",
                    "episodes agreeing",
                ],
                rows,
            )
        )
    iteration = (data.get("transformers") or {}).get("iteration")
    if iteration:
        settings = [k for k, v in iteration.items() if isinstance(v, dict)]
        parts.append(
            "**Iteration wall time** (ALFWorld quickstart, updates included; mean over the timed "
            "iterations):\n\n"
            + markdown_table(
                ["setting", "time_iteration s", "time_rollout s", "time_update s", "staleness", "overlap"],
                [
                    [
                        name,
                        iteration[name]["mean_time_iteration"],
                        iteration[name]["mean_time_rollout"],
                        iteration[name]["mean_time_update"],
                        iteration[name]["staleness_mean"],
                        iteration[name]["rollout_update_overlap"],
                    ]
                    for name in settings
                ],
            )
            + "\n\nSpeed-ups: "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in iteration.items() if k.endswith("speedup"))
        )
    replay = (data.get("transformers") or {}).get("replay")
    if replay:
        parts.append(
            f"**Replay model of the GPU preset** ({replay['note']}; {replay['preset']}; response lengths "
            f"{replay['response_lengths']['distribution']}, "
            f"median {_fmt(replay['response_lengths']['median'])} tokens; episode lengths and env-step "
            f"times: {replay['turns_from']['source']}, {replay['turns_from']['agent']}):\n\n"
            + markdown_table(
                ["per-token latency", "lock-step s", "per-episode s", "speed-up"],
                [
                    [name, run["lockstep_s"], run["per_episode_s"], run["speedup"]]
                    for name, run in replay["runs"].items()
                ],
            )
        )
    if "vllm_cpu_env_steps_speedup" in data:
        parts.append(
            f"Goal: a {_fmt(data['goal_speedup'])}× rollout speed-up on CPU with vLLM-cpu (ALFWorld "
            f"quickstart): measured {_fmt(data['vllm_cpu_env_steps_speedup'])}× env steps/s, "
            f"{_fmt(data['vllm_cpu_tokens_speedup'])}× tokens/s; met: {_fmt(data['meets_goal'])}."
        )
    return "\n\n".join(parts)


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


def render_openenv(data: dict) -> str:
    rows = [
        [
            env_id,
            r["native"]["steps_per_s"],
            r["openenv"]["steps_per_s"],
            r["throughput_ratio"],
            r["native"]["p99_ms"],
            r["openenv"]["p99_ms"],
            r["p99_ratio"],
            r["throughput_ratio"] >= data["target_throughput_ratio"],
            len(r["native"]["errors"]) + len(r["openenv"]["errors"]),
        ]
        for env_id, r in data["results"].items()
    ]
    clients = data["settings"]["clients"]
    return f"{clients} concurrent sessions per protocol. {data.get('notes', '')}\n\n" + markdown_table(
        [
            "env",
            "native steps/s",
            "OpenEnv steps/s",
            "throughput ratio",
            "native p99 ms",
            "OpenEnv p99 ms",
            "p99 ratio",
            f"ratio >= {data['target_throughput_ratio']}",
            "errors",
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
        "quickstart",
        "benchmarks/quickstart.py",
        "The README's main job (`progpo train`, seed 0, the embedded defaults) and RL seeds from its warm "
        "start: success on held-out tasks and on RL's own tasks before and after RL, per seed and over "
        "seeds; "
        "the main job's wall time, CPU time and peak memory. The README's and `configs/quickstart.yaml`'s "
        "quickstart numbers are these.",
        "python benchmarks/quickstart.py --seeds 3 --jobs 2  (from finished runs: --from-runs DIR...)",
        None,
        render_quickstart,
    ),
    Benchmark(
        "quickstart_async",
        "benchmarks/quickstart.py",
        "The quickstart with asynchronous rollouts that overlap the update (`rollout.mode=async "
        "rollout.max_staleness=1`), over the same RL seeds, and its success after RL beside the lock-step "
        "runs' (`quickstart.json`): learning is not hurt when it lies within their spread.",
        "python benchmarks/quickstart.py --seeds 3 --jobs 2 --set rollout.mode=async --set "
        "rollout.max_staleness=1 --run-dir runs/quickstart_async "
        "--out benchmarks/results/quickstart_async.json --baseline benchmarks/results/quickstart.json",
        None,
        render_quickstart_async,
    ),
    Benchmark(
        "async_rollouts",
        "benchmarks/bench_async_rollouts.py",
        "Rollouts without a turn barrier (issue 25): lock-step against per-episode rollout throughput (env "
        "steps/s, tokens/s) on the same episodes, on the transformers engine and on vLLM-cpu, for the "
        "ALFWorld quickstart policy and the WebShop preset's template with a small random-initialised model; "
        "iteration wall time at `rollout.max_staleness` 0 and 1; and a replay *model* of the GPU preset's "
        "turn structure (measured episode lengths and env-step times, assumed response lengths). Needs the "
        "quickstart's warm start and `.venv-vllm`: no quick version.",
        "python benchmarks/bench_async_rollouts.py",
        None,
        render_async_rollouts,
    ),
    Benchmark(
        "progpo_ablation",
        "benchmarks/progpo_ablation.py",
        "ProGPO's reconstruction choices: the first reading's defaults, each change alone and the current "
        "defaults, on the credit diagnostics (expert-noise ALFWorld batches over seeds; the warm start's own "
        "rollouts) and in RL on the quickstart paired with GRPO by seed (from "
        "`compare_estimators_quickstart_ablation`). The defaults of `training/advantages/progpo.py` are "
        "chosen from this table.",
        "python benchmarks/progpo_ablation.py --quick --rollouts runs/policy_rollouts/seed0.jsonl "
        "runs/policy_rollouts/seed1.jsonl runs/policy_rollouts/seed2.jsonl",
        None,
        render_progpo_ablation,
    ),
    Benchmark(
        "kernel_paths",
        "benchmarks/bench_kernel_paths.py",
        "Whether the CPU kernel path changes the quickstart policy's numbers (issue 20: the quickstart did "
        "not reproduce on a fresh machine): one process per `ATEN_CPU_CAPABILITY` setting (unset: the CPU's "
        "best kernels; unset again: a repeat; `default`: the generic code another CPU would take), each "
        "loading the same tiny policy for a forward pass, AdamW steps of language modelling at the warm "
        "start's learning rate and seeded sampling at temperature one; compared with the first setting: the "
        "largest logit and parameter differences, the share of parameters that differ, the final loss, the "
        "share of sampled tokens that agree, and whether the repeat is bit-identical.",
        "python benchmarks/bench_kernel_paths.py",
        ["--steps", "10"],
    ),
    Benchmark(
        "compare_estimators_quickstart_ablation",
        "benchmarks/compare_estimators.py",
        "The RL half of the ProGPO ablation: the quickstart itself (its embedded defaults, held-out "
        "`valid_seen` tasks and RL's own 8 tasks), 3 seeds from one warm start, GRPO and each ProGPO "
        "variant (estimator specs: every ablated parameter spelled out).",
        "python benchmarks/compare_estimators.py --setting quickstart_ablation "
        "--out benchmarks/results/compare_estimators_quickstart_ablation.json",
        None,
        render_compare_estimators,
        full_args=[
            "--setting",
            "quickstart_ablation",
            "--out",
            "benchmarks/results/compare_estimators_quickstart_ablation.json",
        ],
    ),
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
        "with an exact-prefix peer (beside the statistic attributed to the ProGPO paper), the correlation of "
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
        "Speed of every advantage estimator at three batch sizes (CPU seconds, one core) against per-row "
        "Python references; the claim checked (time at the largest size, speed-up, linear growth) is the "
        "result's own.",
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
        "flags (32) `target_speedup` times faster than `--num-envs 1 --concurrency 1` or more; episodes "
        "identical at 1 and 32; the "
        "server's request count equals the recorded steps. Needs `.venv-vllm` (scripts/setup_vllm_cpu.sh): "
        "no quick version.",
        "python benchmarks/bench_eval_concurrency.py",
    ),
    Benchmark(
        "eval_concurrency_stand_in",
        "benchmarks/bench_eval_concurrency.py",
        "The same measurement against a STAND-IN endpoint (no model: a fixed delay per request, any number "
        "at once; `server` below): the harness's side of concurrency only, for machines without vllm-cpu.",
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
        "openenv",
        "benchmarks/bench_openenv.py",
        "The OpenEnv protocol (`progpo serve --protocol openenv`: OpenEnv's own server, `GenericEnvClient` "
        "sessions) against our native protocol on the same machine in one run: steps/s and p99 step latency "
        "with many concurrent sessions on ALFWorld and WebShop; claim: OpenEnv keeps the share of the native "
        "throughput that the result file names as its goal (`target_throughput_ratio`).",
        "python benchmarks/bench_openenv.py",
        ["--quick"],
        render_openenv,
    ),
    Benchmark(
        "training",
        "benchmarks/bench_training.py",
        "Training-loop time split per iteration (rollout / advantages / update) for the tiny and a larger "
        "policy (their parameters in the table); claim: the advantages take a negligible share of an "
        "iteration.",
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
        "logits, same batch, same run (sampling, and a trainer forward + backward), for the tiny and a "
        "larger policy (their parameters in the table; both with the quickstart's 65,536-token vocabulary); "
        "the log-prob difference between the paths.",
        "python benchmarks/bench_constrained.py",
        ["--models", "tiny", "--rows", "16", "--repeats", "1"],
    ),
    Benchmark(
        "memory_budget",
        "benchmarks/memory_budget.py",
        "Per-GPU memory budgets of the two GPU presets (`training/costs.py`: fp32 masters, gradients, AdamW, "
        "the update's snapshot, compute-dtype weights, reference, sampler, KV cache, activations, sync) for "
        "Qwen2.5-1.5B and Qwen2.5-7B at their real shapes, with the transformers engine or vLLM, on 1 or 8 "
        "GPUs (`gpu_memory_bytes` each): computed, not measured; the CPU rehearsal checks the static parts "
        "against what a 2-layer run holds. The numbers the presets' headers state.",
        "python benchmarks/memory_budget.py",
        [],
    ),
    Benchmark(
        "weight_sync",
        "benchmarks/bench_weight_sync.py",
        "The weight sync into vLLM after every update at Qwen2.5-1.5B's real shape (random init, fp32 "
        "masters, bf16 engine) on the CPU: the stream of issue 24 (one tensor at a time in the engine's "
        "dtype into an engine in the trainer's process) against the sync it replaced (the whole fp32 model "
        "as Python bytes in one RPC to vLLM's engine-core process), each in its own process: seconds per "
        "sync and peak host memory above the start, as ratios of one run. Needs vllm-cpu (`.venv-vllm`) and "
        "the RAM of three fp32 copies of the model: no quick version.",
        ".venv-vllm/bin/python benchmarks/bench_weight_sync.py",
    ),
]

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
            + ", ".join(f"{_fmt(v)} on {env}" for env, v in peer.items())
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
            print(f"{args.out} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
