"""Credit-assignment diagnostics: where each advantage estimator puts step-level credit, without training.

Claim measured (issue 8, part 2): on recorded rollout batches, per estimator,

* ``nonzero_step_fraction`` — share of step rows whose *step signal* is non-zero. The step signal is the part
  of the advantage that is not the trajectory-level (episode) advantage: ``A - A_episode`` where ``A_episode``
  is the same estimator with its step term switched off by the parameters its registration names
  (``ESTIMATORS[name].episode_only``: GiGPO/G2PO/ProGPO ``step_weight=0``, GraphGPO ``beta_g=0``). GRPO, RLOO
  and DAPO have no step term (empty ``episode_only``): 0 by definition.
* ``exact_prefix_peer_fraction`` (a property of the batch) — share of rows whose whole history ``(o_0, a_0,
  ..., o_t)`` is shared by another row of the same task group; ProGPO's peer comparison needs one. The ProGPO
  paper (as quoted by a third party, algorithms.md §6) reports that 33.7% of WebShop and 44.5% of ALFWorld
  steps have *none*. ``anchor_peer_fraction`` is the same for GiGPO's key (the current observation).
* ``corr_progress`` — Pearson correlation between each row's advantage and its **true value under the
  expert**, defined here as the *progress* of the action: ``d(s_t) - d(s_{t+1})``, where ``d`` is the length
  of the expert's plan from a state (ALFWorld: :meth:`ALFWorldExpert.plan` on the engine's true facts, exact
  step counts; ``d = 0`` once won). +1 = the action did one step of the optimal plan, 0 = wasted step, < 0 =
  undid progress. Rows without a known ``d`` (WebShop has no plan-length oracle) are left out.
* ``corr_expert`` — Pearson correlation of the advantage with ``1[a_t == expert's action at s_t]`` (every env
  with ``info["expert_action"]``).
* ``step_corr_progress`` / ``step_sign_accuracy`` — the same for the step signal alone, on the rows where it
  is non-zero: does the step-level credit point the right way? (sign accuracy: among those rows with non-zero
  progress, the share where ``sign(step signal) == sign(progress)``.)
* ``advantage_var`` / ``step_var`` — population variance of the advantages and of the step signal.

Batches: groups of ``G`` rollouts of one task (same start state, as GRPO-style training draws them) where each
step takes the expert's action with probability ``1 - p`` and a uniformly random admissible action with
probability ``p`` ("expert mixed with a noisy policy"), for several noise levels ``p``. ALFWorld tasks are the
generated games (every task type); WebShop goals come from the self-hosted shop (a small generated catalog). A
saved JSONL of rollouts (e.g. from the warm-started policy) can be analysed with ``--rollouts FILE``; its
format is :func:`load_rollouts_jsonl`.

Seeded and reproducible: the action choices come from ``numpy.random.default_rng([seed, p_index, task, k])``.
Run: ``.venv/bin/python benchmarks/credit_diagnostics.py --quick`` (about 2-4 min on a loaded 2-core machine;
the full setting about 4x that). Writes ``benchmarks/results/credit_diagnostics.json`` and ``.png``.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import numpy as np

from benchmarks.common import RESULTS_DIR, git_commit, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.credit import (
    QUICK,
    DiagnosticsConfig,
    analyse,
    load_rollouts_jsonl,
    parse_estimator_spec,
    record_source,
    save_rollouts_jsonl,
)
from benchmarks.lib.markdown import fmt, markdown_table


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(result: dict, console) -> None:
    """One rich table per (source, noise) batch."""
    from rich.table import Table

    for source, by_noise in result["sources"].items():
        for label, entry in by_noise.items():
            b = entry["batch"]
            title = (
                f"{source} {label}: {b['rows']} rows, {b['trajectories']} rollouts, success "
                f"{b['success_rate']:.2f}, "
                f"exact-prefix peer {b['exact_prefix_peer_fraction']:.3f}, anchor peer "
                f"{b['anchor_peer_fraction']:.3f}"
            )
            table = Table(title=title)
            for col in (
                "estimator",
                "non-zero step",
                "corr(A, progress)",
                "corr(A, expert)",
                "step corr(progress)",
                "step sign acc.",
                "var(A)",
                "var(step)",
            ):
                table.add_column(col, justify="right" if col != "estimator" else "left")
            for name, m in entry["estimators"].items():
                table.add_row(
                    name,
                    *(
                        _fmt(m[k])
                        for k in (
                            "nonzero_step_fraction",
                            "corr_progress",
                            "corr_expert",
                            "step_corr_progress",
                            "step_sign_accuracy",
                            "advantage_var",
                            "step_var",
                        )
                    ),
                )
            console.print(table)


def plot(result: dict, path: Path) -> None:
    """Non-zero step fraction and corr(A, progress or expert) against the noise level, per estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = [s for s, v in result["sources"].items() if any(k.startswith("p=") for k in v)]
    if not sources:
        return
    fig, axes = plt.subplots(len(sources), 2, figsize=(11, 3.6 * len(sources)), squeeze=False)
    for row, source in enumerate(sources):
        entries = {float(k[2:]): v for k, v in result["sources"][source].items() if k.startswith("p=")}
        ps = sorted(entries)
        corr_key = (
            "corr_progress" if entries[ps[0]]["batch"]["progress_labelled_fraction"] > 0 else "corr_expert"
        )
        for name in result["config"]["estimators"]:
            nz = [entries[p]["estimators"][name]["nonzero_step_fraction"] for p in ps]
            cr = [entries[p]["estimators"][name][corr_key] for p in ps]
            axes[row][0].plot(ps, nz, marker="o", label=name)
            axes[row][1].plot(ps, [np.nan if c is None else c for c in cr], marker="o", label=name)
        peer = [1 - entries[p]["batch"]["exact_prefix_peer_fraction"] for p in ps]
        axes[row][0].plot(ps, peer, "k--", label="steps without exact-prefix peer")
        axes[row][0].set(
            title=f"{source}: rows with non-zero step signal", xlabel="noise p", ylim=(-0.02, 1.02)
        )
        axes[row][1].set(title=f"{source}: {corr_key.replace('_', '(A, ')})", xlabel="noise p")
        axes[row][1].axhline(0, color="grey", lw=0.5)
    axes[0][0].legend(fontsize=7, loc="best")
    save_figure(fig, path)


@dataclass
class Settings:
    quick: bool = option(False, "fewer tasks, noise levels and steps (~2-4 min)")
    seed: int = option(0, "recording seed")
    noise: list[float] | None = option(None, "noise levels p (default 0.1 0.3 0.5 0.7 0.9)")
    group_size: int | None = option(None, "rollouts per task group (default: DiagnosticsConfig's)")
    sources: list[str] | None = option(
        None,
        "env sources to record (none: only --rollouts files)",
        nargs="*",
        choices=["alfworld", "webshop"],
    )
    estimators: list[str] | None = option(
        None,
        "estimator specs: name or name:key=value,... "
        "(default: every registered estimator plus progpo:success_potential=0)",
    )
    rollouts: list[Path] = option(
        [],
        "also analyse a saved rollout JSONL (format: load_rollouts_jsonl), e.g. the "
        "warm-started policy's batches; repeatable",
        action="append",
        nargs=None,
    )
    save_batches: Path | None = option(None, "folder to write every recorded batch as JSONL")
    out: Path = option(RESULTS_DIR / "credit_diagnostics.json", "result file (the plot is written beside it)")

    def __post_init__(self):
        if self.noise is not None and any(not 0.0 <= p <= 1.0 for p in self.noise):
            raise ValueError("--noise values must lie in [0, 1]")
        for spec in self.estimators or []:
            parse_estimator_spec(spec)  # a ValueError names the bad spec


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])

    from rich.console import Console
    from rich.progress import Progress

    cfg = DiagnosticsConfig(seed=settings.seed, **(QUICK if settings.quick else {}))
    for key in ("noise", "group_size", "sources", "estimators"):
        if getattr(settings, key) is not None:
            setattr(cfg, key, getattr(settings, key))
    console = Console(width=160)
    start = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "credit_diagnostics",
        "command": "python benchmarks/credit_diagnostics.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "config": asdict(cfg),
        "quick": bool(settings.quick),
        "definitions": {
            "step_signal": "A - A(step term off); 0 for trajectory-level estimators",
            "progress": "d(s_t) - d(s_t+1), d = length of the expert's plan from the true state (0 once won)",
            "exact_prefix_peer_fraction": "rows whose (o_0, a_0, ..., o_t) is shared by another row of the "
            "group",
            "paper_no_peer_fraction": {"webshop": 0.337, "alfworld": 0.445},
        },
        "machine": machine_info(load_average_1m=os.getloadavg()[0], numpy=np.__version__),
        "git": git_commit(),
        "sources": {},
    }
    if settings.save_batches:
        settings.save_batches.mkdir(parents=True, exist_ok=True)
    with Progress(console=console, transient=True) as bar:
        for source in cfg.sources:
            for ni, noise in enumerate(cfg.noise):
                task = bar.add_task(f"{source} p={noise}", total=None)
                try:
                    rows = record_source(source, cfg, ni, lambda t=task: bar.advance(t))
                except Exception as exc:  # an env that is not usable here is reported, not fatal
                    result["sources"].setdefault(source, {})["error"] = f"{type(exc).__name__}: {exc}"
                    console.print(f"[red]{source}: recording failed: {exc}")
                    break
                if settings.save_batches:
                    save_rollouts_jsonl(rows, settings.save_batches / f"{source}_p{noise}.jsonl")
                result["sources"].setdefault(source, {})[f"p={noise}"] = analyse(rows, cfg.estimators)
                bar.remove_task(task)
    for path in settings.rollouts:
        rows = load_rollouts_jsonl(path)
        result["sources"].setdefault("rollouts", {})[path.name] = analyse(rows, cfg.estimators)
    result["seconds"] = time.perf_counter() - start
    print_table(result, console)
    save_result(result, settings.out)
    plot(result, settings.out.with_suffix(".png"))
    console.print(f"wrote {settings.out} ({result['seconds']:.0f} s)")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
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
                    f"; {FOLLOWED_ESTIMATOR} {fmt(followed)} ({rank}/{len(values)})"
                    if followed is not None and followed != best
                    else ""
                )
                cells.append(f"{leaders} {fmt(best)}{mine}")
            rows.append([source, label, *cells])
    return (
        f"**Summary, every ranked column** (higher is better): per batch, the leading estimator and "
        f"{FOLLOWED_ESTIMATOR}'s value and rank among the estimators with a value.\n\n"
        + markdown_table(["source", "batch", *(t for _, t in RANKED_DIAG_COLUMNS)], rows)
    )


SPECS = (
    Benchmark(
        "credit_diagnostics",
        script_path(__file__),
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
)


if __name__ == "__main__":
    sys.exit(main())
