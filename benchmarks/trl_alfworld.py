"""TRL on ALFWorld over seeds: ``benchmarks/results/trl_alfworld.json`` and ``trl_alfworld.png``.

Runs ``examples/trl_alfworld.py`` (TRL's ``SFTTrainer`` warm start of the tiny policy on the expert's tool
calls, then ``GRPOTrainer(environment_factory=...)`` against the ALFWorld OpenEnv server; held-out success
before and after GRPO) once per seed, each in its own process with its own server. Seed 0 runs the whole
example; seeds ``1..N-1`` start from **seed 0's warm start** (``--warm-start <seed 0>/sft``), so the spread
over seeds is the spread of GRPO (its task draws and sampling) from one warm start, as in
``benchmarks/quickstart.py``; ``--own-warm-start`` gives every seed its own SFT instead.

For every seed the result holds the example's ``result.json`` (held-out success before and after GRPO: mean,
spread over the evaluation's sampling seeds, what the tool calls looked like; the SFT and GRPO logs), the
change after − before, and the wall time, CPU seconds and peak RSS of the run (``os.wait4``). Over seeds:
``mean_before``, ``mean_after``, ``std_after`` (sample std, n − 1) and the change's mean and std, whether
GRPO raised success beyond the spread (``gain_beyond_spread``: the mean change larger than the std of success
after GRPO over seeds and than the evaluations' own sampling spread), the command, the machine.

Run (from the repository root)::

    .venv/bin/python benchmarks/trl_alfworld.py                  # seeds 0, 1, 2
    .venv/bin/python benchmarks/trl_alfworld.py --reuse          # run only the seeds without a result.json
    .venv/bin/python benchmarks/trl_alfworld.py --from-runs runs/trl_alfworld/seed0 runs/trl_alfworld/seed1 \\
        runs/trl_alfworld/seed2                                  # read finished runs, run nothing
    .venv/bin/python benchmarks/trl_alfworld.py --example-arg=--grpo-steps=20   # any flag of the example

Run folders: ``runs/trl_alfworld/seed<k>``. Then ``python benchmarks/report.py`` puts the numbers on the
results page.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, machine_info, mean_spread, save_figure, save_result
from benchmarks.harness import Benchmark, option, parse_config, recorded_command, script_path, usage_error
from benchmarks.lib.markdown import fmt, markdown_table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/trl_alfworld.py"
RUN_DIR = Path("runs") / "trl_alfworld"
#: The example's shortened run (a few SFT and GRPO steps, a couple of episodes): ``--quick`` and the CI test.
QUICK_ARGS = (
    "--sft-tasks=12",
    "--sft-epochs=2",
    "--eval-tasks=2",
    "--eval-seeds=1",
    "--grpo-steps=2",
    "--grpo-prompts=1",
    "--num-generations=2",
    "--max-completion-length=384",
    "--max-tool-calls=3",
)


def seed_arguments(seed: int, run_dir: Path, own_warm_start: bool, extra: tuple[str, ...] = ()) -> list[str]:
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


def run_example(arguments: list[str], timeout_s: float) -> dict[str, Any]:
    """``python examples/trl_alfworld.py arguments`` from the repository root, its output in
    ``<run>/run.log``; returns the status, the command and the process's resources (``os.wait4``: wall time,
    user and system CPU seconds, peak RSS in decimal GB, its children included)."""
    run_dir = ROOT / arguments[arguments.index("--run-dir") + 1]
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    with (run_dir / "run.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, EXAMPLE, *arguments], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
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
    record = {
        "status": "timeout" if timed_out else "ok" if process.returncode == 0 else "failed",
        "returncode": process.returncode,
        "command": shlex.join(["python", EXAMPLE, *arguments]),
        "resources": {
            "wall_s": time.perf_counter() - started,
            "user_cpu_s": usage.ru_utime,
            "system_cpu_s": usage.ru_stime,
            "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux reports KiB
        },
    }
    save_result(record, run_dir / "resources.json")
    return record


def read_run(run_dir: Path) -> dict[str, Any]:
    """One seed's record: the example's ``result.json``, the change after − before and, when this script
    ran it, its command and resources. FileNotFoundError when the run did not finish."""
    path = run_dir / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no result.json (the run did not finish)")
    result = json.loads(path.read_text())
    if "after" not in result:
        raise ValueError(f"{path}: no success after GRPO (run with --grpo-steps > 0)")
    resources_path = run_dir / "resources.json"
    started = json.loads(resources_path.read_text()) if resources_path.is_file() else {}
    return {
        "seed": result["settings"]["seed"],
        "run_dir": _shown(run_dir),
        "before": result["before"]["success"],
        "after": result["after"]["success"],
        "change": result["after"]["success"] - result["before"]["success"],
        "warm_start_from": result.get("warm_start_from"),
        "command": started.get("command"),
        "resources": started.get("resources"),
        "result": result,
    }


def build_result(run_dirs: list[Path], command: str) -> dict[str, Any]:
    """The seeds' records and the numbers over seeds (see the module docstring)."""
    seeds = [read_run(d) for d in run_dirs]
    before = mean_spread([s["before"] for s in seeds])
    after = mean_spread([s["after"] for s in seeds])
    change = mean_spread([s["change"] for s in seeds])
    sampling_spread = max(
        (s["result"][when]["spread"] for s in seeds for when in ("before", "after")), default=0.0
    )
    first = seeds[0]["result"]
    return {
        "benchmark": "trl_alfworld",
        "command": command,
        "example": EXAMPLE,
        "seeds": seeds,
        "mean_before": before["mean"],
        "std_before": before["std"],
        "mean_after": after["mean"],
        "std_after": after["std"],
        "mean_change": change["mean"],
        "std_change": change["std"],
        "seeds_where_it_rose": sum(s["change"] > 0 for s in seeds),
        "seeds_where_it_fell": sum(s["change"] < 0 for s in seeds),
        "max_sampling_spread": sampling_spread,
        "gain_beyond_spread": bool(change["mean"] > max(after["std"] or 0.0, sampling_spread)),
        "held_out_tasks": len(first["held_out_tasks"]),
        "eval_seeds": first["settings"]["eval_seeds"],
        "temperature": first["settings"]["temperature"],
        "settings": first["settings"],
        "machine": machine_info(load_average_1m=os.getloadavg()[0]),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out success before and after GRPO per seed (error bars: spread over sampling seeds) and the mean
    over seeds (error bars: sample std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    seeds = result["seeds"]
    labels = [f"seed {s['seed']}" for s in seeds] + ["mean"]
    before = [s["before"] for s in seeds] + [result["mean_before"]]
    after = [s["after"] for s in seeds] + [result["mean_after"]]
    before_err = [s["result"]["before"]["spread"] for s in seeds] + [result["std_before"]]
    after_err = [s["result"]["after"]["spread"] for s in seeds] + [result["std_after"]]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar(x - 0.2, before, 0.4, yerr=before_err, capsize=3, label="after SFT (before GRPO)")
    ax.bar(x + 0.2, after, 0.4, yerr=after_err, capsize=3, label="after GRPO")
    ax.set_xticks(x, labels)
    ax.set(
        title=f"TRL on ALFWorld: held-out success ({result['held_out_tasks']} valid_seen tasks)",
        ylabel="success",
        ylim=(0, 1),
    )
    ax.legend(fontsize=8)
    save_figure(fig, path)


@dataclass
class Settings:
    seeds: int = option(3, "seeds 0..N-1 (seed 0 runs the whole example, SFT included)")
    own_warm_start: bool = option(False, "every seed runs its own SFT (default: seeds 1.. reuse seed 0's)")
    timeout: float = option(5400.0, "seconds allowed per run of the example")
    reuse: bool = option(False, "run only the seeds whose run folder has no result.json")
    quick: bool = option(
        False, "a smoke run: one seed of the example's shortened run (a few SFT and GRPO steps), no files"
    )
    from_runs: list[Path] | None = option(
        None, "run nothing: read these finished run folders (seed 0 first)", metavar="DIR"
    )
    run_dir: Path = option(RUN_DIR, "the runs' parent folder (seed k: <run-dir>/seed<k>)")
    example_args: list[str] = option(
        [],
        "an argument for every run of the example (e.g. --example-arg=--grpo-steps=20); repeatable",
        flag="--example-arg",
        action="append",
        nargs=None,
        metavar="ARG",
    )
    out: Path = option(RESULTS_DIR / "trl_alfworld.json", "result file (the plot is written beside it)")

    def __post_init__(self):
        if self.seeds < 1:
            raise ValueError("--seeds must be at least 1")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    argv = list(sys.argv[1:] if argv is None else argv)
    command = recorded_command(script_path(__file__), argv)
    if settings.from_runs:
        run_dirs = settings.from_runs
        missing = [str(d) for d in run_dirs if not (d / "result.json").is_file()]
        if missing:
            usage_error(f"no result.json in {', '.join(missing)}")
    else:
        extra = (*(QUICK_ARGS if settings.quick else ()), *settings.example_args)
        parent = Path(f"{settings.run_dir}_quick") if settings.quick else settings.run_dir
        run_dirs = [ROOT / parent / f"seed{seed}" for seed in range(1 if settings.quick else settings.seeds)]
        for seed, run_dir in enumerate(run_dirs):  # in order: seeds 1.. start from seed 0's warm start
            if settings.reuse and (run_dir / "result.json").is_file():
                print(f"seed {seed}: reusing {_shown(run_dir)}", flush=True)
                continue
            arguments = seed_arguments(seed, parent, settings.own_warm_start, extra)
            print(f"seed {seed}: python {EXAMPLE} {shlex.join(arguments)}", flush=True)
            record = run_example(arguments, settings.timeout)
            print(f"seed {seed}: {record['status']} in {record['resources']['wall_s']:.0f} s", flush=True)
            if record["status"] != "ok":
                print(f"seed {seed} did not finish: see {_shown(run_dir / 'run.log')}", flush=True)
                return 1
    try:
        result = build_result(run_dirs, command)
    except (FileNotFoundError, ValueError) as exc:
        usage_error(str(exc))
    for s in result["seeds"]:
        print(f"seed {s['seed']}: held-out success {s['before']:.1%} -> {s['after']:.1%}", flush=True)
    print(
        f"mean over {len(result['seeds'])} seeds: {result['mean_before']:.1%} -> {result['mean_after']:.1%} "
        f"(std after {result['std_after']:.1%}; change {result['mean_change']:+.1%} ± "
        f"{result['std_change']:.1%}; beyond the spread: {result['gain_beyond_spread']})",
        flush=True,
    )
    if settings.quick:
        return 0
    save_result(result, settings.out)
    plot(result, settings.out.with_suffix(".png"))
    print(f"wrote {_shown(settings.out)} and {settings.out.with_suffix('.png').name}", flush=True)
    return 0


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


def render(data: dict) -> str:
    settings = data["settings"]
    rows = [
        [
            s["seed"],
            fmt(s["before"]),
            fmt(s["after"]),
            f"{s['change']:+.4g}",
            fmt((s["resources"] or {}).get("wall_s")),
        ]
        for s in data["seeds"]
    ]
    rows.append(
        [
            f"mean ± std (n = {len(data['seeds'])})",
            f"{fmt(data['mean_before'])} ± {fmt(data['std_before'])}",
            f"{fmt(data['mean_after'])} ± {fmt(data['std_after'])}",
            f"{data['mean_change']:+.4g} ± {fmt(data['std_change'])}",
            "",
        ]
    )
    return "\n\n".join(
        [
            f"Held-out success ({data['held_out_tasks']} generated valid_seen tasks × "
            f"{data['eval_seeds']} sampling seeds at temperature {fmt(data['temperature'])}) after TRL's "
            f"SFTTrainer warm start and after {settings['grpo_steps']} GRPOTrainer steps against the "
            "ALFWorld OpenEnv server; seeds 1.. start from seed 0's warm start.",
            markdown_table(["seed", "before GRPO", "after GRPO", "change", "wall s"], rows),
            f"GRPO raised success beyond the spread: {data['gain_beyond_spread']} (rose in "
            f"{data['seeds_where_it_rose']}, fell in {data['seeds_where_it_fell']} of "
            f"{len(data['seeds'])} seeds).",
        ]
    )


SPECS = (
    Benchmark(
        "trl_alfworld",
        script_path(__file__),
        "TRL alone on ALFWorld (examples/trl_alfworld.py): SFTTrainer on the expert's tool calls, then "
        "GRPOTrainer(environment_factory=...) against the OpenEnv server; held-out success before and after "
        "GRPO over 3 seeds, and whether GRPO raised it beyond the spread.",
        "python benchmarks/trl_alfworld.py",
        quick_args=["--quick"],
        render=render,
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
