"""ProGPO's reconstruction choices, measured: the first reading, each change alone, and the current defaults
(issue 20).

ProGPO is reconstructed from its abstract (docs/algorithms.md §6), so each reconstructed choice is a switch,
and a default is kept only where a measurement supports it. The variants (:data:`VARIANTS`) are the first
reading's defaults (terminal potential r_succ under the step-return target, every depth's precision summed,
normalised-text expansion, the row's own return inside its potential), each change applied alone, and the
estimator's current defaults. Every variant is scored three ways:

* **credit diagnostics on expert-noise batches** (``benchmarks/credit_diagnostics.py``): generated ALFWorld
  groups where each step takes the expert's action or, with probability p, a random admissible one; every
  column of that benchmark (correlation of the advantage with the expert's progress and with the expert's
  action; the same for the step signal alone, its sign accuracy; the share of rows it reaches), each the
  mean over the noise levels of one seed, then mean ± sample std over ``--seeds``;
* **credit diagnostics on the policy's own rollouts** (``--rollouts``: JSONL files recorded from the
  quickstart's warm start with ``benchmarks/record_policy_rollouts.py``, one per recording seed), mean ± std
  over the files;
* **RL on the quickstart** (read from ``compare_estimators --setting quickstart_ablation``'s JSON): held-out
  success and success on RL's own 8 tasks after 30 iterations, and both paired with GRPO by seed (the runs of
  one seed share the warm start, RL seed and evaluation tasks).

GiGPO, G2PO and GraphGPO are listed beside the variants on the diagnostics, for scale.

Run: ``.venv/bin/python benchmarks/progpo_ablation.py --rollouts runs/policy_rollouts/seed0.jsonl
runs/policy_rollouts/seed1.jsonl runs/policy_rollouts/seed2.jsonl`` (about 15 min on 2 cores, after the RL
comparison). Writes ``benchmarks/results/progpo_ablation.json`` and ``.png``.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    git_commit,
    machine_info,
    mean_spread,
    paired_differences,
    save_figure,
    save_result,
)
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.credit import (
    PROGPO_CHANGES,
    PROGPO_FIRST_READING,
    QUICK,
    DiagnosticsConfig,
    analyse,
    load_rollouts_jsonl,
    parse_estimator_spec,
    progpo_spec,
    record_source,
)
from benchmarks.lib.markdown import fmt, markdown_table
from training.advantages.progpo import ProGPOConfig

ROOT = Path(__file__).resolve().parents[1]

#: label -> estimator spec: the first reading, each change alone, then the current defaults (``progpo``).
VARIANTS: dict[str, str] = {
    "first reading": progpo_spec(),
    **{
        f"+ {key}={json.dumps(value).strip(chr(34))}": progpo_spec(**{key: value})
        for key, value in PROGPO_CHANGES.items()
    },
    "current defaults": "progpo",
}
#: The other step-level estimators, for scale on the diagnostics.
REFERENCES = [
    "gigpo",
    "g2po",
    "g2po:state_key=observation_actions",
    "graphgpo",
    "graphgpo:state_key=observation_actions",
]
#: Every column of the credit diagnostics (benchmarks/credit_diagnostics.py defines them).
DIAGNOSTICS = [
    "corr_progress",
    "corr_expert",
    "step_corr_progress",
    "step_sign_accuracy",
    "nonzero_step_fraction",
]
#: RL metrics read from the comparison: held-out success and RL's own tasks, absolute and minus GRPO's.
RL_METRICS = ["success", "rl_tasks_success"]


def current_progpo_defaults() -> dict[str, Any]:
    """The ablated parameters' current defaults (``ProGPOConfig``), for the table's header."""
    defaults = {f.name: f.default for f in fields(ProGPOConfig)}
    return {key: defaults[key] for key in PROGPO_FIRST_READING}


def seed_means(per_batch: list[dict[str, dict[str, float | None]]], spec: str, metric: str) -> float | None:
    """Mean of ``metric`` over the batches (noise levels) of one seed; batches where it is undefined
    (a trajectory-level estimator's step columns, a batch without variance) are left out.

    Example:
        >>> seed_means([{"a": {"m": 0.2}}, {"a": {"m": None}}, {"a": {"m": 0.4}}], "a", "m")
        0.30000000000000004
    """
    values = [batch[spec][metric] for batch in per_batch if batch[spec][metric] is not None]
    return float(np.mean(values)) if values else None


def aggregate(
    seeds: list[list[dict[str, dict[str, float | None]]]], specs: list[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{spec: {metric: mean_spread over seeds}}`` from per-seed lists of per-batch estimator metrics.

    Args:
        seeds: one entry per seed (or rollout file): the list of its batches' ``{spec: {metric: value}}``.
        specs: estimator specs to aggregate.

    Example:
        >>> one = [{"a": {m: 0.5 for m in DIAGNOSTICS}}]
        >>> two = [{"a": {m: 0.7 for m in DIAGNOSTICS}}]
        >>> round(aggregate([one, two], ["a"])["a"]["corr_expert"]["mean"], 6)
        0.6
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for spec in specs:
        out[spec] = {}
        for metric in DIAGNOSTICS:
            values = [seed_means(batches, spec, metric) for batches in seeds]
            out[spec][metric] = mean_spread([v for v in values if v is not None])
    return out


def noise_diagnostics(specs: list[str], seeds: list[int], quick: bool, progress) -> list[list[dict]]:
    """Per seed, the per-noise-level estimator metrics on generated ALFWorld expert-noise batches."""
    out = []
    for seed in seeds:
        cfg = DiagnosticsConfig(seed=seed, sources=["alfworld"], **(QUICK if quick else {}))
        batches = []
        for noise_index, _ in enumerate(cfg.noise):
            rows = record_source("alfworld", cfg, noise_index)
            batches.append(analyse(rows, specs)["estimators"])
            progress()
        out.append(batches)
    return out


def rl_summary(comparison: dict[str, Any], specs: dict[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per variant label: each RL metric's mean_spread over seeds and its paired difference with GRPO."""
    runs = [r for r in comparison.get("runs", []) if r.get("final")]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, spec in specs.items():
        mine = [r for r in runs if r["estimator"] == spec]
        out[label] = {"seeds": sorted(r["seed"] for r in mine)}
        for metric in RL_METRICS:
            out[label][metric] = mean_spread([r["final"][metric] for r in mine if metric in r["final"]])
            paired = paired_differences([r for r in runs if r["estimator"] in (spec, "grpo")], metric)
            out[label][f"{metric}_minus_grpo"] = next(iter(paired.values()), mean_spread([]))
    grpo = [r for r in runs if r["estimator"] == "grpo"]
    out["grpo"] = {
        "seeds": sorted(r["seed"] for r in grpo),
        **{m: mean_spread([r["final"][m] for r in grpo if m in r["final"]]) for m in RL_METRICS},
    }
    return out


def _cell(stat: dict[str, Any] | None, signed: bool = False) -> str:
    if not stat or stat.get("n", 0) == 0:
        return "—"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(stat['mean'])} ± {stat['std']:.3f}"


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The ablation's tables as ``(title, header, rows)`` of display strings: the diagnostics on each batch
    kind (every column; the variants, then the reference estimators), then RL against GRPO. The terminal
    (:func:`print_table`) and the results page (``benchmarks/report.py``) both show these."""
    variants = result["variants"]
    out = []
    kinds = (("noise", "expert-noise ALFWorld batches"), ("policy", "the warm start's own rollouts"))
    for part, title in kinds:
        if not result.get(part):
            continue
        rows = [
            [label, *(_cell(result[part][variants.get(label, label)].get(m)) for m in DIAGNOSTICS)]
            for label in [*variants, *result.get("references", REFERENCES)]
        ]
        out.append((f"Credit diagnostics on {title}", ["variant", *DIAGNOSTICS], rows))
    if result.get("rl"):
        rows = []
        for label in [*variants, "grpo"]:
            row = result["rl"].get(label, {})
            rows.append(
                [
                    label,
                    _cell(row.get("success")),
                    _cell(row.get("success_minus_grpo"), signed=True),
                    _cell(row.get("rl_tasks_success")),
                    _cell(row.get("rl_tasks_success_minus_grpo"), signed=True),
                    str(len(row.get("seeds", []))),
                ]
            )
        out.append(
            (
                "RL on the quickstart (30 iterations from one warm start; after RL; paired with GRPO by "
                "seed)",
                ["variant", "held-out", "held-out − GRPO", "RL's tasks", "RL's tasks − GRPO", "seeds"],
                rows,
            )
        )
    return out


def print_table(result: dict[str, Any], console) -> None:
    from rich.table import Table

    for title, header, rows in tables(result):
        table = Table(title=f"{title}: mean ± std over seeds")
        for col in header:
            table.add_column(col, justify="left" if col == "variant" else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)


def plot(result: dict[str, Any], path: Path) -> None:
    """Bars with seed spreads: step sign accuracy and corr(A, progress) on both batch kinds, and RL's paired
    differences with GRPO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["variants"])
    panels = [
        (part, metric)
        for part in ("noise", "policy")
        if result[part]
        for metric in ("corr_progress", "step_sign_accuracy")
    ]
    rl_panels = [m for m in ("success_minus_grpo", "rl_tasks_success_minus_grpo") if result["rl"]]
    fig, axes = plt.subplots(
        1, len(panels) + len(rl_panels), figsize=(4.2 * (len(panels) + len(rl_panels)), 4)
    )
    axes = np.atleast_1d(axes)
    x = np.arange(len(labels))
    for ax, (part, metric) in zip(axes, panels, strict=False):
        stats = [result[part][result["variants"][label]][metric] for label in labels]
        ax.bar(x, [s["mean"] or 0 for s in stats], yerr=[s["std"] or 0 for s in stats], capsize=3)
        ax.set(title=f"{metric} ({part})", xticks=x)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    for ax, metric in zip(axes[len(panels) :], rl_panels, strict=False):
        stats = [result["rl"][label][metric] for label in labels]
        ax.bar(x, [s["mean"] or 0 for s in stats], yerr=[s["std"] or 0 for s in stats], capsize=3)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(title=f"RL: {metric.replace('_minus_grpo', '')} − GRPO", xticks=x)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    save_figure(fig, path)


@dataclass
class Settings:
    seeds: list[int] = option([0, 1, 2], "expert-noise batch seeds")
    quick: bool = option(False, "the diagnostics' quick batches (fewer tasks)")
    rollouts: list[Path] = option([], "policy rollout JSONL files, one per seed", nargs="*")
    comparison: Path = option(
        RESULTS_DIR / "compare_estimators_quickstart_ablation.json",
        "the RL comparison's JSON (compare_estimators --setting quickstart_ablation)",
    )
    out: Path = option(RESULTS_DIR / "progpo_ablation.json", "result file")
    reuse_diagnostics: bool = option(
        False,
        "keep the diagnostics --out already holds when they were computed for the same variants, seeds "
        "and rollout files; only read the RL comparison again (after it finished)",
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])

    from rich.console import Console
    from rich.progress import Progress

    specs = [*VARIANTS.values(), *REFERENCES]
    for spec in specs:
        parse_estimator_spec(spec)
    console = Console(width=170)
    start = time.perf_counter()
    noise_levels = len((QUICK if settings.quick else {}).get("noise", DiagnosticsConfig().noise))
    diagnostics_config = {
        "seeds": settings.seeds,
        "quick": settings.quick,
        "diagnostics": asdict(DiagnosticsConfig(sources=["alfworld"], **(QUICK if settings.quick else {}))),
        "rollouts": [str(p) for p in settings.rollouts],
    }
    previous = (
        json.loads(settings.out.read_text()) if settings.reuse_diagnostics and settings.out.exists() else {}
    )
    reusable = (previous.get("variants"), previous.get("references")) == (VARIANTS, REFERENCES) and all(
        previous.get("config", {}).get(k) == v for k, v in diagnostics_config.items()
    )
    if settings.reuse_diagnostics and not reusable:
        console.print(f"[yellow]{settings.out} holds other diagnostics: computing them again")
    if reusable:
        noise_result, policy_result = previous["noise"], previous["policy"]
    else:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(
                "diagnostics", total=len(settings.seeds) * noise_levels + len(settings.rollouts)
            )
            noise = noise_diagnostics(specs, settings.seeds, settings.quick, lambda: bar.advance(task))
            policy = []
            for path in settings.rollouts:
                policy.append([analyse(load_rollouts_jsonl(path), specs)["estimators"]])
                bar.advance(task)
        noise_result, policy_result = aggregate(noise, specs), aggregate(policy, specs) if policy else {}
    comparison = json.loads(settings.comparison.read_text()) if settings.comparison.exists() else {}
    result = {
        "benchmark": "progpo_ablation",
        "command": "python benchmarks/progpo_ablation.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "variants": VARIANTS,
        "references": REFERENCES,
        "first_reading": PROGPO_FIRST_READING,
        "current_defaults": current_progpo_defaults(),
        "config": {
            **diagnostics_config,
            "comparison": str(settings.comparison),
            "comparison_command": comparison.get("command"),
        },
        "noise": noise_result,
        "policy": policy_result,
        "rl": rl_summary(comparison, VARIANTS) if comparison else {},
        "machine": machine_info(),
        "git": git_commit(),
        "seconds": time.perf_counter() - start,
    }
    print_table(result, console)
    save_result(result, settings.out)
    plot(result, settings.out.with_suffix(".png"))
    console.print(f"wrote {settings.out} ({result['seconds']:.0f} s)")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


def render_progpo_ablation(data: dict) -> str:
    """The ablation's three tables: diagnostics on both batch kinds (every column), then RL vs GRPO."""
    parts = [
        "First reading: "
        + ", ".join(f"`{k}={v}`" for k, v in data["first_reading"].items())
        + ". Current defaults: "
        + ", ".join(f"`{k}={v}`" for k, v in data["current_defaults"].items())
        + " (`success_potential=None`: 0 for the step-return target). Each cell: mean ± sample std over "
        f"seeds (diagnostics: batch seeds {fmt(data['config']['seeds'])}, each the mean over the noise "
        "levels; policy: one rollout file per recording seed; RL: RL seeds)."
    ]
    parts += [f"**{title}**\n\n" + markdown_table(header, rows) for title, header, rows in tables(data)]
    return "\n\n".join(parts)


SPECS = (
    Benchmark(
        "progpo_ablation",
        script_path(__file__),
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
)


if __name__ == "__main__":
    sys.exit(main())
