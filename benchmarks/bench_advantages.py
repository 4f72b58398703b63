"""Speed of every advantage estimator at 250k / 500k / 1M step rows, against per-row Python references.

Claim measured (issue 3): each estimator handles 1,000,000 rows in under 2 s on one core, at least 10x
faster than a straightforward per-row Python-dict implementation of the same formula, with cost linear in
rows. Batches come from ``tests/training/advantages/advantages_batches.py``: task groups of 8 trajectories
of up to 50 steps over small deterministic worlds (shared start state, revisits, loops, ~5% invalid actions,
~55% success), i.e. blocks shaped like one 128-group training batch, repeated until the row count is
reached. The Python references (``tests/training/advantages/advantages_reference.py``) are timed on
``--reference-rows`` rows and scaled linearly to 1M (they are linear: dict lookups per row); the JSON says
so. Their output is also compared with the fast estimators' on that batch.

Run: ``.venv/bin/python benchmarks/bench_advantages.py`` (about 2-4 minutes on a quiet core).
Times are process CPU seconds (single-threaded code), which a shared machine disturbs far less than wall time.
Writes ``benchmarks/results/advantages.json`` and ``advantages.png``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.markdown import markdown_table
from training.advantages import ESTIMATORS, compute_advantages

ROOT = Path(__file__).resolve().parents[1]


def _test_module(name: str):
    """A module of ``tests/training/advantages/`` (the batches and the per-row references live with the
    tests), loaded from its file: the benchmark needs no ``tests`` package on ``sys.path``."""
    path = ROOT / "tests" / "training" / "advantages" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


random_walk_batch = _test_module("advantages_batches").random_walk_batch
REFERENCES = _test_module("advantages_reference").REFERENCES

TARGET_SECONDS = 2.0
TARGET_SPEEDUP = 10.0


def _timed(fn, repeats: int) -> tuple[float, float, np.ndarray]:
    """``(best CPU seconds, median wall seconds, output)`` over ``repeats`` calls.

    The estimators are single-threaded, so the process CPU time is the time on one core; on a shared machine
    it is far less disturbed by other processes than wall time, which is recorded alongside.
    """
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        out = fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return min(cpu), statistics.median(wall), out


def _subset(batch: dict, n: int) -> dict:
    return {k: v[:n] for k, v in batch.items()}


@dataclass
class Settings:
    sizes: list[int] = option([250_000, 500_000, 1_000_000], "step rows per batch")
    reference_rows: int = option(100_000, "rows the Python references are timed on (then scaled linearly)")
    repeats: int = option(3, "timed calls per size (the best is kept)")
    seed: int = option(0, "batch seed")
    out: Path = option(RESULTS_DIR / "advantages.json", "result file (the plot is written beside it)")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.splitlines()[0])
    console = Console(width=150)
    load_at_start = os.getloadavg()[0]
    names = sorted(ESTIMATORS)
    largest = max(settings.sizes)
    reference_rows, repeats = settings.reference_rows, settings.repeats

    n_groups = largest // 200 + 16  # ~250 rows per group of 8 trajectories
    full = random_walk_batch(n_groups, seed=settings.seed, n_rows=largest)
    traj_len = np.bincount(full["traj_id"])
    console.print(
        f"batch: {largest} rows, {len(np.unique(full['group_id']))} groups, "
        f"{traj_len.size} trajectories, mean length {traj_len.mean():.1f}, "
        f"success {full['won'].sum() / traj_len.size:.2f}"
    )

    fast: dict[str, dict[int, float]] = {n: {} for n in names}
    wall: dict[str, dict[int, float]] = {n: {} for n in names}
    for size in settings.sizes:
        batch = _subset(full, size)
        for name in track(names, description=f"fast estimators at {size} rows"):
            fast[name][size], wall[name][size], _ = _timed(
                lambda b=batch, n=name: compute_advantages(n, b), settings.repeats
            )
    shuffled = {}
    perm = np.random.default_rng(settings.seed).permutation(largest)
    shuffled_batch = {k: v[perm] for k, v in full.items()}
    for name in track(names, description=f"fast estimators, {largest} rows in random order"):
        shuffled[name], _, _ = _timed(lambda n=name: compute_advantages(n, shuffled_batch), settings.repeats)

    ref_batch = _subset(full, settings.reference_rows)
    reference, ref_fast, max_diff = {}, {}, {}
    for name in track(names, description=f"Python references at {settings.reference_rows} rows"):
        reference[name], _, ref_out = _timed(lambda n=name: REFERENCES[n](ref_batch), 1)
        ref_fast[name], _, fast_out = _timed(
            lambda n=name: compute_advantages(n, ref_batch), settings.repeats
        )
        max_diff[name] = float(np.abs(ref_out - fast_out).max())

    scale = largest / settings.reference_rows
    table = Table(title=f"Advantage estimators: CPU seconds on one core (best of {settings.repeats})")
    for col in (
        "estimator",
        *[f"{s // 1000}k s" for s in settings.sizes],
        f"{largest // 1000}k shuffled s",
        f"t({largest // 1000}k)/t({min(settings.sizes) // 1000}k)",
        f"ref @{largest // 1000}k s (scaled)",
        "speedup",
        "max |diff| vs ref",
    ):
        table.add_column(col, justify="right")
    results = {}
    for name in names:
        t_big = fast[name][largest]
        ref_big = reference[name] * scale
        growth = t_big / fast[name][min(settings.sizes)]
        results[name] = {
            "seconds_by_rows": {str(s): fast[name][s] for s in settings.sizes},
            "wall_seconds_median_by_rows": {str(s): wall[name][s] for s in settings.sizes},
            "seconds_per_million_rows_by_rows": {str(s): fast[name][s] / s * 1e6 for s in settings.sizes},
            "seconds_shuffled_rows": shuffled[name],
            "growth_largest_over_smallest": growth,
            "reference_seconds_measured": reference[name],
            "reference_rows": settings.reference_rows,
            "reference_seconds_scaled_to_largest": ref_big,
            "fast_seconds_at_reference_rows": ref_fast[name],
            "speedup_same_size": reference[name] / ref_fast[name],
            "speedup_vs_scaled_reference": ref_big / t_big,
            "max_abs_diff_vs_reference": max_diff[name],
            "meets_time_target": t_big < TARGET_SECONDS,
            "meets_speedup_target": ref_big / t_big >= TARGET_SPEEDUP,
        }
        table.add_row(
            name,
            *[f"{fast[name][s]:.3f}" for s in settings.sizes],
            f"{shuffled[name]:.3f}",
            f"{growth:.2f}",
            f"{ref_big:.1f}",
            f"{ref_big / t_big:.0f}x",
            f"{max_diff[name]:.1e}",
        )
    console.print(table)

    payload = {
        "claim": f"every estimator on {largest} rows < {TARGET_SECONDS} s on one core, "
        f">= {TARGET_SPEEDUP}x a per-row Python-dict reference, linear in rows",
        "batch": {
            "rows": largest,
            "groups": int(len(np.unique(full["group_id"]))),
            "trajectories": int(traj_len.size),
            "trajectory_length_mean": float(traj_len.mean()),
            "trajectory_length_max": int(traj_len.max()),
            "success_rate": float(full["won"].sum() / traj_len.size),
            "generator": "tests/training/advantages/advantages_batches.py:random_walk_batch (groups of 8 "
            "trajectories, up to 50 steps, shared start state, revisits/loops, ~5% invalid actions); smaller "
            "sizes are prefixes of the largest batch; rows in trajectory-major order unless "
            "'shuffled'",
            "seed": settings.seed,
        },
        "reference_note": f"Python references timed once on the first {reference_rows} rows and scaled "
        f"linearly (x{scale:g}) to {largest} rows; 'speedup_same_size' compares both at "
        f"{reference_rows} rows",
        "timing": f"seconds = best of {repeats} runs of process CPU time (time.process_time; the code "
        "is single-threaded, OMP_NUM_THREADS=1, so this is time on one core); median wall time recorded too. "
        "The Python reference is timed once. The benchmark machine is shared (load average recorded).",
        "results": results,
        "all_meet_time_target": all(r["meets_time_target"] for r in results.values()),
        "all_meet_speedup_target": all(r["meets_speedup_target"] for r in results.values()),
        "machine": machine_info(
            load_average_1m_at_start=load_at_start,
            load_average_1m_at_end=os.getloadavg()[0],
            numpy=np.__version__,
            processor=platform.processor(),
        ),
    }
    save_result(payload, settings.out)
    _plot(results, settings.sizes, settings.out.with_suffix(".png"))
    console.print(f"wrote {settings.out} and {settings.out.with_suffix('.png')}")
    return 0


def _plot(results: dict, sizes: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        ax.plot(
            [s / 1e6 for s in sizes], [r["seconds_by_rows"][str(s)] for s in sizes], marker="o", label=name
        )
    ax.axhline(TARGET_SECONDS, color="red", linestyle="--", label=f"target {TARGET_SECONDS:g} s")
    ax.set_xlabel("rows (millions)")
    ax.set_ylabel("CPU seconds (one core)")
    ax.set_title("compute_advantages: time vs rows")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, ncol=2)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


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


SPECS = (
    Benchmark(
        "advantages",
        script_path(__file__),
        "Speed of every advantage estimator at three batch sizes (CPU seconds, one core) against per-row "
        "Python references; the claim checked (time at the largest size, speed-up, linear growth) is the "
        "result's own.",
        "python benchmarks/bench_advantages.py",
        ["--sizes", "100000", "200000", "--reference-rows", "20000", "--repeats", "1"],
        render_advantages,
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
