"""ALFWorld env speed and memory vs the unpatched engine, measured in one run on the same games.

Measures (targets from issues 2 and 34):

* step latency of ``progpo/ALFWorld-v0`` vs ALFWorld's own stack (``AlfredDemangler`` over a stock TextWorld
  ``PddlEnv``, no patches) on the same games and the same admissible-action sequences — target ≥ 20× (issue
  34; ≥ 3× before): ``step_speedup`` with the game played again, as a task group's copies play it, and
  ``step_speedup_first_play`` with every in-process cache cleared before the game;
* reset latency: the unpatched reset (``textworld.gym`` reloads the game: ``load`` + ``reset``); our first
  reset of a game in a process whose caches are cold (``reset_ms_first``: the game's translation kept on
  disk by an earlier process, as after its first play on the machine; ``reset_ms_first_untranslated``:
  nothing on disk either, the game's first reset ever), the first reset of a game in a process that has
  played another (``reset_ms_first_warm_process``), and our repeated reset of the same game — targets:
  repeated ≥ 5× faster than first, first ≤ 300 ms (issue 34); ``first_reset_breakdown`` times the phases
  of the first resets (the grammar's parse, the translation, the engine state, the first derivations);
* steps/s of a group vector env (4 copies, 2 groups) in-process vs in 2 subprocesses — target async ≥ 1.6×
  sync;
* resident memory per env (one loaded game each);
* wrapper overhead: the share of ``env.step`` not spent in the engine (action checks, history keys, info) —
  target < 5%.

Run:  ``ALFWORLD_DATA=/path/to/alfworld nice .venv/bin/python benchmarks/bench_alfworld.py [--quick]`` (the
folder that contains ``json_2.1.1/``, or ``--data-dir``; writes ``benchmarks/results/alfworld.json``)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import fast_downward
import gymnasium as gym
import psutil
import textworld
import textworld.envs.pddl.logic as pddl_logic
from rich.console import Console
from rich.table import Table
from textworld.envs.pddl import PddlEnv

import progpo_envs  # noqa: F401
from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from progpo_base.usage import UsageError, report
from progpo_envs.alfworld import engine as alfworld_engine
from progpo_envs.alfworld import wheel
from progpo_envs.alfworld.data import load_tasks
from progpo_envs.alfworld.engine import EnginePatches, active_patches, clear_caches
from progpo_envs.alfworld.env import ALFWorldEnv
from progpo_envs.alfworld.task_types import TASK_TYPES

REPO = Path(__file__).resolve().parents[1]
RESULTS = RESULTS_DIR / "alfworld.json"
#: The phases of a reset timed by :func:`reset_phases` (docs/alfworld.md §3).
PHASES = ("grammar_parse", "translation", "engine_state", "first_derivations")


class StockALFWorld:
    """ALFWorld's own single-game stack, unpatched: what ``textworld.gym`` + ``AlfredDemangler`` do."""

    def __init__(self):
        tw_env = wheel.import_alfworld("alfworld.agents.environment.alfred_tw_env")
        with active_patches(EnginePatches.stock()):
            self.env = tw_env.AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True)))
        self.state = None

    def reset(self, game_file: Path) -> str:
        argv = list(sys.argv)
        with active_patches(EnginePatches.stock()):
            self.env.load(str(game_file))
            self.state = self.env.reset()
        sys.argv[:] = argv  # keep this script's arguments (the stock engine overwrites them)
        return self.state.feedback

    def step(self, command: str) -> str:
        with active_patches(EnginePatches.stock()):
            self.state, _, _ = self.env.step(command)
        return self.state.feedback

    @property
    def admissible(self) -> list[str]:
        return [c for c in self.state["admissible_commands"] if c != "help"]


@contextlib.contextmanager
def reset_phases():
    """Time the phases of the resets run inside (seconds per phase, summed, in the dict it yields):
    ``grammar_parse`` (the game's logic: TatSu's parse of its grammar document, or the shared one and its
    task rule), ``translation`` (``pddl2sas``: the PDDL translator, or the translation read from disk),
    ``engine_state`` (the rest of ``PddlState``: ``libdownward`` loading the task, the initial facts) and
    ``first_derivations`` (the rest of the reset: the intro text and the admissible commands)."""
    totals: dict[str, float] = collections.defaultdict(float)
    inner: list[float] = []  # time spent in nested timed calls, per open timed call

    def timed(phase: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            inner.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = inner.pop()
                totals[phase] += elapsed - nested
                if inner:
                    inner[-1] += elapsed

        return wrapper

    alfworld_engine.install_patches()  # time the patched functions, as the engine calls them
    targets = [
        (alfworld_engine, "game_logic", "grammar_parse"),
        (pddl_logic.GameLogic, "__init__", "grammar_parse"),
        (fast_downward, "pddl2sas", "translation"),
        (pddl_logic.PddlState, "__init__", "engine_state"),
        (PddlEnv, "reset", "first_derivations"),
        (alfworld_engine, "reset_from_loaded_state", "first_derivations"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, phase in targets:
            setattr(owner, name, timed(phase, getattr(owner, name)))
        yield totals
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def first_resets(data_dir: Path, split: str, indices: list[int], translations: Path, warm_with: int | None):
    """The first reset of each task in ``indices``: every in-process cache cleared before each (or, with
    ``warm_with``, that task reset first, once for all: a process that has played another game), the
    engine's disk cache in ``translations``; the mean milliseconds and the phases (ms per reset)."""
    times = []
    with reset_phases() as totals:
        if warm_with is not None:
            clear_caches()
            env = ALFWorldEnv(split=split, data_dir=data_dir)
            env.engine.disk_cache = translations
            env.reset(options={"task_index": warm_with})
            env.close()
            totals.clear()
        for index in indices:
            if warm_with is None:
                clear_caches()
            env = ALFWorldEnv(split=split, data_dir=data_dir, max_steps=10_000)
            env.engine.disk_cache = translations
            start = time.perf_counter()
            env.reset(options={"task_index": index})
            times.append(time.perf_counter() - start)
            env.close()
    n = len(indices)
    phases = {phase: 1000 * totals.get(phase, 0.0) / n for phase in PHASES}
    phases["other"] = 1000 * statistics.mean(times) - sum(phases.values())
    return 1000 * statistics.mean(times), phases


def bench_first_reset(data_dir: Path, split: str, indices: list[int], warm_with: int) -> dict:
    """First resets three ways (see the module docstring), each with its phases."""
    with tempfile.TemporaryDirectory(prefix="alfworld-translations-") as folder:
        translations = Path(folder)
        untranslated, untranslated_phases = first_resets(data_dir, split, indices, translations, None)
        translated, translated_phases = first_resets(data_dir, split, indices, translations, None)
        warm, warm_phases = first_resets(data_dir, split, indices, translations, warm_with)
    return {
        "reset_ms_first": translated,
        "reset_ms_first_untranslated": untranslated,
        "reset_ms_first_warm_process": warm,
        "first_reset_breakdown": {
            "notes": "ms per first reset, by phase (bench_alfworld.py reset_phases): grammar_parse = the "
            "game's logic (TatSu's parse of the grammar document; shared_logic: once per process, then only "
            "the task rule), translation = pddl2sas (the PDDL translator; translation_cache: read from "
            "disk and the task parsed again), engine_state = the rest of PddlState (libdownward loading the "
            "SAS task, the initial facts; twice: load and reset), first_derivations = the rest of the reset "
            "(the intro text, the admissible commands), other = the rest (reading the game file, "
            "demangling, the env's own info).",
            "untranslated": untranslated_phases,
            "translated": translated_phases,
            "warm_process": warm_phases,
        },
    }


def action_plan(env: ALFWorldEnv, task_index: int, steps: int, seed: int) -> list[str]:
    """A random admissible-action sequence for a task (computed with our env; transcripts are identical)."""
    rng = random.Random(seed)
    _, info = env.reset(options={"task_index": task_index})
    plan = []
    for _ in range(steps):
        action = rng.choice(info["admissible_actions"])
        plan.append(action)
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return plan


def bench_single(data_dir: Path, split: str, num_games: int, steps: int) -> dict:
    """Step and reset latency: ours vs stock on the same games and actions."""
    tasks = load_tasks(split, data_dir)
    chosen = [next(i for i, t in enumerate(tasks) if t.task_type == tt) for tt in TASK_TYPES][:num_games]
    ours_step, stock_step, stock_reset, first_reset, repeat_reset, engine_share = [], [], [], [], [], []
    first_play = []
    for n, index in enumerate(chosen):
        game_file = tasks[index].game_file()
        clear_caches()
        env = ALFWorldEnv(split=split, data_dir=data_dir, max_steps=10_000)
        env.engine.disk_cache = None  # the first reset here is cold (bench_first_reset says more)
        start = time.perf_counter()
        env.reset(options={"task_index": index})
        first_reset.append(time.perf_counter() - start)
        for _ in range(3):
            start = time.perf_counter()
            env.reset(options={"task_index": index})
            repeat_reset.append(time.perf_counter() - start)
        plan = action_plan(env, index, steps, seed=n)
        env.close()

        # Ours, first play: every in-process cache cleared, so nothing of this game (or any other) is known
        clear_caches()
        env = ALFWorldEnv(split=split, data_dir=data_dir, max_steps=10_000)
        env.reset(options={"task_index": index})
        start = time.perf_counter()
        for action in plan:
            env.step(action)
        first_play.append((time.perf_counter() - start) / len(plan))

        # Ours, the game played again (as a task group's copies play it): full env.step, the engine's share
        # timed inside.
        engine_time = [0.0]
        engine_step = env.engine.step

        def timed_engine_step(command, _inner=engine_step, _total=engine_time):
            t0 = time.perf_counter()
            try:
                return _inner(command)
            finally:
                _total[0] += time.perf_counter() - t0

        env.engine.step = timed_engine_step
        env.reset(options={"task_index": index})
        start = time.perf_counter()
        for action in plan:
            env.step(action)
        elapsed = time.perf_counter() - start
        ours_step.append(elapsed / len(plan))
        engine_share.append(engine_time[0] / elapsed)
        env.close()

        stock = StockALFWorld()
        start = time.perf_counter()
        stock.reset(game_file)
        stock_reset.append(time.perf_counter() - start)
        start = time.perf_counter()
        for action in plan:
            stock.step(action)
        stock_step.append((time.perf_counter() - start) / len(plan))
        del stock
        gc.collect()
    ms = 1000.0
    return {
        "chosen": chosen,
        "games": [tasks[i].task_id for i in chosen],
        "steps_per_game": steps,
        "step_ms_ours": statistics.mean(ours_step) * ms,
        "step_ms_ours_first_play": statistics.mean(first_play) * ms,
        "step_ms_stock": statistics.mean(stock_step) * ms,
        "step_speedup": statistics.mean(stock_step) / statistics.mean(ours_step),
        "step_speedup_first_play": statistics.mean(stock_step) / statistics.mean(first_play),
        "reset_ms_stock": statistics.mean(stock_reset) * ms,
        "reset_ms_first_cold": statistics.mean(first_reset) * ms,
        "reset_ms_repeated": statistics.mean(repeat_reset) * ms,
        "repeated_reset_speedup_vs_first": statistics.mean(first_reset) / statistics.mean(repeat_reset),
        "repeated_reset_speedup_vs_stock": statistics.mean(stock_reset) / statistics.mean(repeat_reset),
        "wrapper_overhead_pct": 100.0 * (1.0 - statistics.mean(engine_share)),
        "wrapper_ms_per_step": statistics.mean(ours_step) * (1.0 - statistics.mean(engine_share)) * ms,
    }


def bench_vector(data_dir: Path, split: str, rounds: int, blocks: int = 3) -> dict:
    """Steps/s of 4 copies (2 groups of 2) in-process vs split over 2 worker processes.

    Both vector envs are built and warmed up first, then measured in alternating blocks; the best block of
    each counts, so that load from other processes on a shared machine hits both alike.
    """
    vectors, infos, rngs = {}, {}, {}
    for mode in ("sync", "async"):
        vectors[mode] = gym.make_vec(
            "progpo/ALFWorld-v0",
            num_envs=4,
            group_size=2,
            vector_mode=mode,
            num_workers=2,
            split=split,
            data_dir=data_dir,
            max_steps=10_000,
        )
        rngs[mode] = random.Random(0)
        _, infos[mode] = vectors[mode].reset(options={"task_indices": [0, 1]})
    # CPU time of the processes that step the envs: on a shared machine it tells the engine's cost apart from
    # the share of the CPUs the scheduler gave us (``cpu_share``: CPUs used per wall-clock second).
    stepping = {
        "sync": [psutil.Process()],
        "async": [psutil.Process(pid) for pid in vectors["async"].worker_pids],
    }
    out: dict[str, float] = {}
    cpu_total = dict.fromkeys(vectors, 0.0)
    wall_total = dict.fromkeys(vectors, 0.0)
    try:
        # Block 0 warms up: a fresh process parses the grammar's templates once.
        for block in range(blocks + 1):
            for mode, envs in vectors.items():
                cpu_start = sum(sum(p.cpu_times()[:2]) for p in stepping[mode])
                start = time.perf_counter()
                for _ in range(rounds):
                    actions = [rngs[mode].choice(a) for a in infos[mode]["admissible_actions"]]
                    *_, infos[mode] = envs.step(actions)
                wall = time.perf_counter() - start
                if block:
                    rate = 4 * rounds / wall
                    out[f"steps_per_s_{mode}"] = max(out.get(f"steps_per_s_{mode}", 0.0), rate)
                    cpu_total[mode] += sum(sum(p.cpu_times()[:2]) for p in stepping[mode]) - cpu_start
                    wall_total[mode] += wall
        for mode in vectors:
            out[f"cpu_ms_per_step_{mode}"] = 1000 * cpu_total[mode] / (4 * rounds * blocks)
            out[f"cpu_share_{mode}"] = cpu_total[mode] / wall_total[mode]
        rss = [psutil.Process(pid).memory_info().rss for pid in vectors["async"].worker_pids]
        out["rss_mb_worker_with_2_envs"] = statistics.mean(rss) / 2**20
    finally:
        for envs in vectors.values():
            envs.close()
    out["async_speedup"] = out["steps_per_s_async"] / out["steps_per_s_sync"]
    return out


def bench_memory(data_dir: Path, split: str, num_envs: int) -> dict:
    """Resident memory added per env with one loaded game each (in this process)."""
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    envs = []
    for i in range(num_envs):
        env = ALFWorldEnv(split=split, data_dir=data_dir)
        env.reset(options={"task_index": i})
        envs.append(env)
    gc.collect()
    per_env = (process.memory_info().rss - before) / num_envs
    return {"rss_mb_per_env": per_env / 2**20, "rss_mb_process": process.memory_info().rss / 2**20}


@dataclass
class Settings:
    data_dir: Path | None = option(None, "folder containing json_2.1.1/ (default: $ALFWORLD_DATA)")
    split: str = option("valid_seen", "the ALFWorld split whose games are played")
    quick: bool = option(False, "fewer games and steps")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n")[0])
    num_games, steps, rounds = (2, 8, 10) if settings.quick else (6, 20, 50)
    data_dir = settings.data_dir or (
        Path(os.environ["ALFWORLD_DATA"]) if os.environ.get("ALFWORLD_DATA") else None
    )
    if data_dir is None or not (data_dir / "json_2.1.1" / settings.split).is_dir():
        return report(
            "bench_alfworld",
            UsageError(
                f"no json_2.1.1/{settings.split} in {data_dir}: set ALFWORLD_DATA or --data-dir to the "
                "folder that contains json_2.1.1/ (real ALFWorld trials)"
            ),
        )
    settings.data_dir = data_dir
    load_before = os.getloadavg()

    console = Console()
    console.print(f"[bold]ALFWorld benchmark[/] on {settings.data_dir}/json_2.1.1/{settings.split}")
    single = bench_single(settings.data_dir, settings.split, num_games, steps)
    tasks = load_tasks(settings.split, settings.data_dir)
    warm_with = next(i for i in range(len(tasks)) if i not in single["chosen"])
    single.update(bench_first_reset(settings.data_dir, settings.split, single["chosen"], warm_with))
    vector = bench_vector(settings.data_dir, settings.split, rounds)
    memory = bench_memory(settings.data_dir, settings.split, 4)

    table = Table(title="progpo/ALFWorld-v0 vs the unpatched engine (same games, same actions)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    rows = [
        ("step, unpatched engine (ms)", f"{single['step_ms_stock']:.1f}", ""),
        ("step, ours (ms)", f"{single['step_ms_ours']:.1f}", ""),
        ("step speed-up", f"{single['step_speedup']:.2f}x", ">= 20x"),
        ("step, ours, first play, caches cleared (ms)", f"{single['step_ms_ours_first_play']:.1f}", ""),
        ("step speed-up, first play", f"{single['step_speedup_first_play']:.2f}x", ""),
        ("reset, unpatched (load + reset, ms)", f"{single['reset_ms_stock']:.0f}", ""),
        ("first reset, cold process, translation on disk (ms)", f"{single['reset_ms_first']:.0f}", "<= 300"),
        (
            "first reset, cold process, nothing on disk (ms)",
            f"{single['reset_ms_first_untranslated']:.0f}",
            "",
        ),
        (
            "first reset, a process that played a game (ms)",
            f"{single['reset_ms_first_warm_process']:.0f}",
            "",
        ),
        ("reset, ours, repeated (ms)", f"{single['reset_ms_repeated']:.1f}", ""),
        ("repeated vs first reset", f"{single['repeated_reset_speedup_vs_first']:.1f}x", ">= 5x"),
        ("vector 4 envs, sync (steps/s)", f"{vector['steps_per_s_sync']:.1f}", ""),
        ("vector 4 envs, async 2 workers (steps/s)", f"{vector['steps_per_s_async']:.1f}", ""),
        ("async vs sync", f"{vector['async_speedup']:.2f}x", ">= 1.6x"),
        (
            "CPU ms per step, sync / async",
            f"{vector['cpu_ms_per_step_sync']:.1f} / {vector['cpu_ms_per_step_async']:.1f}",
            "",
        ),
        (
            "CPUs we got while stepping, sync / async",
            f"{vector['cpu_share_sync']:.2f} / {vector['cpu_share_async']:.2f}",
            "",
        ),
        ("memory per extra env in a process (MB RSS)", f"{memory['rss_mb_per_env']:.0f}", ""),
        ("memory of a worker process with 2 envs (MB RSS)", f"{vector['rss_mb_worker_with_2_envs']:.0f}", ""),
        ("wrapper overhead (% of a step)", f"{single['wrapper_overhead_pct']:.2f}%", "< 5%"),
        ("wrapper overhead (ms per step)", f"{single['wrapper_ms_per_step']:.3f}", ""),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)

    load = os.getloadavg()
    for name, phases in single["first_reset_breakdown"].items():
        if isinstance(phases, dict):
            parts = ", ".join(f"{phase} {ms:.0f}" for phase, ms in phases.items())
            console.print(f"first reset ({name}), ms: {parts}")
    # With the kernel's autogroup scheduling, all processes of one session share one CPU share: on a busy
    # shared machine, subprocess workers then get no more CPU than one process (see ``cpu_share_*``).
    autogroup_file = Path("/proc/sys/kernel/sched_autogroup_enabled")
    autogroup = autogroup_file.read_text().strip() == "1" if autogroup_file.exists() else None
    result = {
        "benchmark": "alfworld",
        "machine": machine_info(
            load_average_1_5_15_before=load_before, load_average_1_5_15=load, sched_autogroup=autogroup
        ),
        "data": {"data_dir": str(settings.data_dir), "split": settings.split, "quick": settings.quick},
        "single": single,
        "vector": vector,
        "memory": memory,
        "step_speedup": single["step_speedup"],
        "reset_ms_first": single["reset_ms_first"],
        "targets_met": {
            "step_speedup_3x": single["step_speedup"] >= 3.0,
            "step_speedup_20x": single["step_speedup"] >= 20.0,
            "reset_first_300ms": single["reset_ms_first"] <= 300.0,
            "repeated_reset_5x": single["repeated_reset_speedup_vs_first"] >= 5.0,
            "async_1_6x": vector["async_speedup"] >= 1.6,
            "wrapper_overhead_below_5pct": single["wrapper_overhead_pct"] < 5.0,
        },
    }
    save_result(result, RESULTS)
    console.print(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "alfworld",
        script_path(__file__),
        "ALFWorld env step/reset latency vs the unpatched engine on the same games, group vector env sync vs "
        "async, memory per env, wrapper overhead.",
        "python benchmarks/bench_alfworld.py",
        ["--quick"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
