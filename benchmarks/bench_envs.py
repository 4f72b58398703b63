"""The envs: ALFWorld's engine against the unpatched one on the same games and actions, its vector envs, and
the self-hosted WebShop in process and behind its servers.

``python benchmarks/bench_envs.py PART [--quick]``, PART ``alfworld`` (real trials: ``$ALFWORLD_DATA`` or
``--data-dir``, the folder holding ``json_2.1.1/``) or ``webshop``; what each measures is its result's section
of ``benchmarks/measures.md`` (the results page shows it).
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import numpy as np
import psutil
import requests
from rich.console import Console
from rich.progress import track

from benchmarks.common import ServerProcess, free_port
from benchmarks.harness import Benchmark, Part, PartSettings, option, script_main
from benchmarks.lib.hosting import percentiles
from benchmarks.lib.processes import cpu_seconds
from progpo_base.usage import UsageError

console = Console()
MS = 1000.0

# --- alfworld: our engine against the unpatched one, on the same games and actions ---

#: The phases of a first reset (docs/alfworld.md §3).
PHASES = ("grammar_parse", "translation", "engine_state", "first_derivations")


class StockALFWorld:
    """ALFWorld's own single-game stack, unpatched: what ``textworld.gym`` + ``AlfredDemangler`` do."""

    def __init__(self):
        import textworld
        from textworld.envs.pddl import PddlEnv

        from progpo_envs.alfworld import wheel
        from progpo_envs.alfworld.engine import EnginePatches, active_patches

        self.stock = functools.partial(active_patches, EnginePatches.stock())
        tw_env = wheel.import_alfworld("alfworld.agents.environment.alfred_tw_env")
        with self.stock():
            self.env = tw_env.AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True)))

    def reset(self, game_file: Path) -> None:
        argv = list(sys.argv)
        with self.stock():
            self.env.load(str(game_file))
            self.env.reset()
        sys.argv[:] = argv  # keep this script's arguments (the stock engine overwrites them)

    def step(self, command: str) -> None:
        with self.stock():
            self.env.step(command)


def timed(fn, totals: dict[str, float], key: str, nested: list[float]):
    """``fn``, adding the seconds of each call to ``totals[key]`` without those of the timed calls nested in
    it (``nested``: the time spent in them, per open timed call, shared by the functions timed together)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nested.append(0.0)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            totals[key] += elapsed - nested.pop()
            if nested:
                nested[-1] += elapsed

    return wrapper


@contextlib.contextmanager
def reset_phases():
    """Time the phases of the resets run inside (seconds per phase, summed, in the dict it yields), each
    call's own time without the timed calls nested in it."""
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    from textworld.envs.pddl import PddlEnv

    from progpo_envs.alfworld import engine

    totals: dict[str, float] = collections.defaultdict(float)
    nested: list[float] = []  # shared by the phases: a phase's time leaves out the phases it calls

    engine.install_patches()  # time the patched functions, as the engine calls them
    targets = [
        (engine, "game_logic", "grammar_parse"),
        (pddl_logic.GameLogic, "__init__", "grammar_parse"),
        (fast_downward, "pddl2sas", "translation"),
        (pddl_logic.PddlState, "__init__", "engine_state"),
        (PddlEnv, "reset", "first_derivations"),
        (engine, "reset_from_loaded_state", "first_derivations"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, phase in targets:
            setattr(owner, name, timed(getattr(owner, name), totals, phase, nested))
        yield totals
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def our_env(settings, **engine):
    """``progpo/ALFWorld-v0``'s env on the settings' split, its engine's attributes set from ``engine``."""
    from progpo_envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split=settings.split, data_dir=settings.data_dir, max_steps=10_000)
    for key, value in engine.items():
        setattr(env.engine, key, value)
    return env


def first_resets(settings, indices: list[int], translations: Path, warm_with: int | None):
    """Mean ms of the first reset of each task of ``indices`` (every in-process cache cleared before each,
    or, with ``warm_with``, once before all after that task's reset), and ms per phase."""
    from progpo_envs.alfworld.engine import clear_caches

    times = []
    with reset_phases() as totals:
        if warm_with is not None:
            clear_caches()
            env = our_env(settings, disk_cache=translations)
            env.reset(options={"task_index": warm_with})
            env.close()
            totals.clear()
        for index in indices:
            if warm_with is None:
                clear_caches()
            env = our_env(settings, disk_cache=translations)
            start = time.perf_counter()
            env.reset(options={"task_index": index})
            times.append(time.perf_counter() - start)
            env.close()
    phases = {phase: MS * totals.get(phase, 0.0) / len(indices) for phase in PHASES}
    phases["other"] = MS * statistics.mean(times) - sum(phases.values())
    return MS * statistics.mean(times), phases


def play(env, index: int, plan: list[str], reset: bool = True) -> float:
    """Seconds per step of ``plan`` after a reset to task ``index`` (or where ``env`` is now)."""
    if reset:
        env.reset(options={"task_index": index})
    start = time.perf_counter()
    for action in plan:
        env.step(action)
    return (time.perf_counter() - start) / len(plan)


def bench_single(settings, games: int, steps: int) -> dict:
    """Step and reset latency, ours against stock, on the same games and actions."""
    from progpo_envs.alfworld.data import load_tasks
    from progpo_envs.alfworld.engine import clear_caches
    from progpo_envs.alfworld.task_types import TASK_TYPES

    tasks = load_tasks(settings.split, settings.data_dir)
    chosen = [next(i for i, t in enumerate(tasks) if t.task_type == tt) for tt in TASK_TYPES][:games]
    times = collections.defaultdict(list)
    for n, index in enumerate(chosen):
        clear_caches()
        env = our_env(settings, disk_cache=None)  # the first reset here is cold (first_resets says more)
        for kind in ("first", "repeated", "repeated", "repeated"):
            start = time.perf_counter()
            _, info = env.reset(options={"task_index": index})
            times[f"reset_{kind}"].append(time.perf_counter() - start)
        rng, plan = random.Random(n), []  # a random admissible-action sequence
        for _ in range(steps):
            plan.append(rng.choice(info["admissible_actions"]))
            _, _, terminated, truncated, info = env.step(plan[-1])
            if terminated or truncated:
                break
        env.close()
        clear_caches()  # ours, first play: nothing of this game (or any other) known in the process
        env = our_env(settings)
        times["first_play"].append(play(env, index, plan))
        engine = collections.defaultdict(float)  # ours, played again: the engine's share timed
        env.engine.step = timed(env.engine.step, engine, "step", [])
        times["ours"].append(play(env, index, plan))
        times["engine_share"].append(engine["step"] / (times["ours"][-1] * len(plan)))
        env.close()
        stock = StockALFWorld()
        start = time.perf_counter()
        stock.reset(tasks[index].game_file())
        times["stock_reset"].append(time.perf_counter() - start)
        times["stock"].append(play(stock, index, plan, reset=False))
        del stock
        gc.collect()
    m = {key: statistics.mean(values) for key, values in times.items()}
    return {
        "chosen": chosen,
        "games": [tasks[i].task_id for i in chosen],
        "steps_per_game": steps,
        "step_ms_ours": m["ours"] * MS,
        "step_ms_ours_first_play": m["first_play"] * MS,
        "step_ms_stock": m["stock"] * MS,
        "step_speedup": m["stock"] / m["ours"],
        "step_speedup_first_play": m["stock"] / m["first_play"],
        "reset_ms_stock": m["stock_reset"] * MS,
        "reset_ms_first_cold": m["reset_first"] * MS,
        "reset_ms_repeated": m["reset_repeated"] * MS,
        "repeated_reset_speedup_vs_first": m["reset_first"] / m["reset_repeated"],
        "repeated_reset_speedup_vs_stock": m["stock_reset"] / m["reset_repeated"],
        "wrapper_overhead_pct": 100.0 * (1.0 - m["engine_share"]),
        "wrapper_ms_per_step": m["ours"] * (1.0 - m["engine_share"]) * MS,
    }


def bench_vector(settings, rounds: int, blocks: int = 3) -> dict:
    """Steps/s of 4 copies (2 groups of 2) in-process against 2 worker processes: both built and warmed up,
    then alternating blocks (the best block of each counts, so that load from other processes hits both
    alike), with the CPU time of the processes that step them (the CPUs they got per wall second)."""
    import gymnasium as gym

    vectors, infos, rngs = {}, {}, {}
    for mode in ("sync", "async"):
        vectors[mode] = gym.make_vec(
            "progpo/ALFWorld-v0", num_envs=4, group_size=2, vector_mode=mode, num_workers=2,
            split=settings.split, data_dir=settings.data_dir, max_steps=10_000,
        )  # fmt: skip
        rngs[mode] = random.Random(0)
        _, infos[mode] = vectors[mode].reset(options={"task_indices": [0, 1]})
    stepping = {
        "sync": [psutil.Process()],
        "async": [psutil.Process(p) for p in vectors["async"].worker_pids],
    }
    out: dict[str, float] = {}
    cpu, wall = dict.fromkeys(vectors, 0.0), dict.fromkeys(vectors, 0.0)
    try:
        for block in range(blocks + 1):  # block 0 warms up: a fresh process parses the grammar once
            for mode, envs in vectors.items():
                cpu_start, start = cpu_seconds(stepping[mode]), time.perf_counter()
                for _ in range(rounds):
                    actions = [rngs[mode].choice(a) for a in infos[mode]["admissible_actions"]]
                    *_, infos[mode] = envs.step(actions)
                elapsed = time.perf_counter() - start
                if block:
                    key = f"steps_per_s_{mode}"
                    out[key] = max(out.get(key, 0.0), 4 * rounds / elapsed)
                    cpu[mode] += cpu_seconds(stepping[mode]) - cpu_start
                    wall[mode] += elapsed
        for mode in vectors:
            out[f"cpu_ms_per_step_{mode}"] = MS * cpu[mode] / (4 * rounds * blocks)
            out[f"cpu_share_{mode}"] = cpu[mode] / wall[mode]
        rss = [p.memory_info().rss for p in stepping["async"]]
        out["rss_mb_worker_with_2_envs"] = statistics.mean(rss) / 2**20
    finally:
        for envs in vectors.values():
            envs.close()
    out["async_speedup"] = out["steps_per_s_async"] / out["steps_per_s_sync"]
    return out


def bench_env_memory(settings, num_envs: int) -> dict:
    """Resident memory added per env with one loaded game each (in this process)."""
    from progpo_envs.alfworld.env import ALFWorldEnv

    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    envs = [ALFWorldEnv(split=settings.split, data_dir=settings.data_dir) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(options={"task_index": i})
    gc.collect()
    per_env = (process.memory_info().rss - before) / num_envs
    return {"rss_mb_per_env": per_env / 2**20, "rss_mb_process": process.memory_info().rss / 2**20}


@dataclass
class AlfworldSettings(PartSettings):
    data_dir: Path | None = option(None, "folder containing json_2.1.1/ (default: $ALFWORLD_DATA)")
    split: str = option("valid_seen", "the ALFWorld split whose games are played")
    quick: bool = option(False, "2 games of 8 steps, 10 vector rounds; generated games without real ones")

    def __post_init__(self):
        self.data_dir = self.data_dir or (
            Path(os.environ["ALFWORLD_DATA"]) if os.environ.get("ALFWORLD_DATA") else None
        )
        if self.data_dir is None and self.quick:  # a smoke run plays the generated games
            return
        if self.data_dir is None or not (self.data_dir / "json_2.1.1" / self.split).is_dir():
            raise UsageError(
                f"no json_2.1.1/{self.split} in {self.data_dir}: set ALFWORLD_DATA or --data-dir to the "
                "folder that contains json_2.1.1/ (real ALFWorld trials)"
            )


def run_alfworld(s: AlfworldSettings) -> dict:
    """ALFWorld's engine against the unpatched one: steps, resets, vector envs, memory, wrapper overhead."""
    from progpo_envs.alfworld.data import load_tasks

    games, steps, rounds = (2, 8, 10) if s.quick else (6, 20, 50)
    source = f"{s.data_dir}/json_2.1.1" if s.data_dir else "generated games"
    console.print(f"[bold]ALFWorld[/] on {source}, {s.split}: {games} games, ours and stock")
    single = bench_single(s, games, steps)
    warm_with = next(i for i in range(len(load_tasks(s.split, s.data_dir))) if i not in single["chosen"])
    with tempfile.TemporaryDirectory(prefix="alfworld-translations-") as folder:
        first = {
            name: first_resets(s, single["chosen"], Path(folder), warm)
            for name, warm in (("untranslated", None), ("translated", None), ("warm_process", warm_with))
        }  # in this order: the first pass fills the disk cache the second reads
    single.update(
        reset_ms_first=first["translated"][0],
        reset_ms_first_untranslated=first["untranslated"][0],
        reset_ms_first_warm_process=first["warm_process"][0],
        first_reset_breakdown={
            "notes": "ms per first reset, by phase: grammar_parse = the game's logic (TatSu's parse of the "
            "grammar document; shared_logic: once per process, then only the task rule), translation = "
            "pddl2sas (the PDDL translator; translation_cache: read from disk and the task parsed again), "
            "engine_state = the rest of PddlState (libdownward loading the SAS task, the initial facts; "
            "twice: load and reset), first_derivations = the rest of the reset (the intro text, the "
            "admissible commands), other = the rest (reading the game file, demangling, the env's own info).",
            **{name: phases for name, (_, phases) in first.items()},
        },
    )
    console.print("vector envs, sync against 2 workers; memory per env")
    vector, memory = bench_vector(s, rounds), bench_env_memory(s, 4)
    # With the kernel's autogroup scheduling, all processes of one session share one CPU share: on a busy
    # shared machine, subprocess workers then get no more CPU than one process (see ``cpu_share_*``).
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    return {
        "machine": {"sched_autogroup": autogroup.read_text().strip() == "1" if autogroup.exists() else None},
        "data": {"data_dir": str(s.data_dir or "generated"), "split": s.split, "quick": s.quick},
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


# --- webshop: the in-process env, the HTTP servers, memory per worker and over sessions ---

TARGET_P99_SEARCH_MS = 20.0
TARGET_WORKER_BYTES = 1 << 30


def expert_episodes(engine, goals) -> tuple[list[tuple[int, list[str]]], list[float]]:
    """The expert's action list per goal (recorded once, replayed by every measurement), and its scores."""
    from webshop_server.expert import expert_action

    episodes, scores = [], []
    for goal_index in track(goals, description="record expert episodes", console=console):
        session, actions = engine.new_session(goal_index), []
        while (action := expert_action(engine, session)) is not None and len(actions) < 15:
            engine.step(session, action)
            actions.append(action)
        episodes.append((goal_index, actions))
        scores.append(session.score or 0.0)
    return episodes, scores


def bench_in_process(engine, episodes) -> dict:
    from progpo_envs.webshop.env import WebShopEnv

    env = WebShopEnv(engine=engine, split="all")
    engine.clear_search_cache()
    search, other = [], []
    start = time.perf_counter()
    for goal_index, actions in track(episodes, description="in-process env", console=console):
        env.reset(options={"task_index": goal_index})
        for action in actions:
            t0 = time.perf_counter()
            env.step(action)
            (search if action.startswith("search[") else other).append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    bare = []
    for _, actions in episodes:
        t0 = time.perf_counter()
        engine.index.search(actions[0][len("search[") : -1], top_k=50)
        bare.append(time.perf_counter() - t0)
    search_step, index_search = percentiles(search), percentiles(bare)
    return {
        "steps": len(search) + len(other),
        "episodes": len(episodes),
        "steps_per_s": (len(search) + len(other)) / elapsed,
        "search_step": search_step,
        "other_step": percentiles(other),
        "index_search_baseline": index_search,
        "search_step_over_index_p50": search_step["p50_ms"] / index_search["p50_ms"],
    }


def server_memory(pid: int) -> dict:
    """RSS, USS and PSS of the server's processes (waitress: one; gunicorn: the master and its workers)."""
    root = psutil.Process(pid)
    info = [(p.pid, p.memory_full_info()) for p in [root, *root.children(recursive=True)]]
    workers = info[1:] or info  # gunicorn workers are the children; waitress serves from the root process
    return {
        "processes": [{"pid": p, "rss": m.rss, "uss": m.uss, "pss": m.pss} for p, m in info],
        "total_rss": sum(m.rss for _, m in info),
        "total_pss": sum(m.pss for _, m in info),
        "max_worker_rss": max(m.rss for _, m in workers),
        "max_worker_uss": max(m.uss for _, m in workers),
    }


def play_sessions(url: str, episodes, clients: int, each, stop) -> list[tuple[str, float]]:
    """``clients`` threads, each playing expert episodes over the JSON API (``each(k)``: client ``k``'s
    episodes, until ``stop()``); every request's kind and seconds."""
    records, lock = [], threading.Lock()

    def client(k: int) -> None:
        http, local = requests.Session(), []
        for goal_index, actions in each(k):
            if stop():
                break
            t0 = time.perf_counter()
            body = {"goal_index": goal_index, "split": "all"}
            sid = http.post(url + "/api/sessions", json=body).json()["session_id"]
            local.append(("create", time.perf_counter() - t0))
            for action in actions:
                t0 = time.perf_counter()
                reply = http.post(f"{url}/api/sessions/{sid}/step", json={"action": action})
                reply.raise_for_status()
                local.append(
                    ("search" if action.startswith("search[") else "click", time.perf_counter() - t0)
                )
            t0 = time.perf_counter()
            http.delete(f"{url}/api/sessions/{sid}")
            local.append(("close", time.perf_counter() - t0))
        with lock:
            records.extend(local)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


def bench_http(url: str, episodes, clients: int, seconds: float) -> dict:
    stop_at = time.perf_counter() + seconds

    def each(k: int):
        rng = np.random.default_rng(k)
        while True:
            yield episodes[int(rng.integers(len(episodes)))]

    start = time.perf_counter()
    records = play_sessions(url, episodes, clients, each, lambda: time.perf_counter() >= stop_at)
    return {
        "clients": clients,
        "requests": len(records),
        "requests_per_s": len(records) / (time.perf_counter() - start),
        "all": percentiles([d for _, d in records]),
        "search_step": percentiles([d for kind, d in records if kind == "search"]),
    }


def bench_session_memory(url: str, pid: int, episodes, total: int, clients: int = 8) -> dict:
    """The server's PSS (pages shared by its processes counted once) over ``total`` sessions created, searched
    once and closed, sampled every 1,000."""
    per_client = total // clients
    samples = [(0, server_memory(pid)["total_pss"])]
    done, lock = [0], threading.Lock()

    def each(k: int):
        for i in range(per_client):
            goal_index, actions = episodes[(k * per_client + i) % len(episodes)]
            yield goal_index, actions[:1]
            with lock:
                done[0] += 1
                if done[0] % 1000 == 0:
                    samples.append((done[0], server_memory(pid)["total_pss"]))

    play_sessions(url, episodes, clients, each, lambda: False)
    samples.append((done[0], server_memory(pid)["total_pss"]))
    warm = samples[1][1]  # after the first 1000: caches and allocator pools are warm
    return {
        "sessions": done[0],
        "pss_samples": samples,
        "pss_growth_after_first_1000_bytes": samples[-1][1] - warm,
        "pss_growth_after_first_1000_pct": 100.0 * (samples[-1][1] - warm) / warm,
        "sessions_open_at_end": requests.get(url + "/api/health").json()["sessions"],
    }


@dataclass
class WebShopSettings(PartSettings):
    num_products: int = option(100_000, "catalog size (--quick: 10,000)")
    episodes: int = option(300, "expert episodes replayed")
    seconds: float = option(4.0, "duration of each HTTP concurrency level")
    sessions: int = option(10_000, "sessions for the memory-growth check")
    threads: int = option(8, "waitress worker threads")
    processes: int = option(2, "gunicorn worker processes")
    quick: bool = option(False, "10,000 products")


def run_webshop(s: WebShopSettings) -> dict:
    """The self-hosted WebShop: in-process env, HTTP servers, memory per worker and over sessions."""
    from webshop_server.engine import WebShopEngine, split_range

    products = 10_000 if s.quick else s.num_products
    console.print(f"[bold]WebShop[/] at {products:,} products")
    t0 = time.perf_counter()
    engine = WebShopEngine.shared(products, 0)
    load_s = time.perf_counter() - t0
    episodes, scores = expert_episodes(engine, split_range("all", engine.num_goals)[: s.episodes])
    in_process = bench_in_process(engine, episodes)
    in_process["expert"] = {
        "episodes": len(scores),
        "mean_score": float(np.mean(scores)),
        "success_rate": float(np.mean(np.asarray(scores) == 1.0)),
        "mean_steps": float(np.mean([len(a) for _, a in episodes])),
    }
    servers = {}
    for server, workers in (("waitress", s.threads), ("gunicorn", s.processes)):
        console.print(f"{server} ({workers} workers): 1, 8 and 32 clients, then {s.sessions:,} sessions")
        port, t0 = free_port(), time.perf_counter()
        command = [sys.executable, "-m", "webshop_server.cli", "serve", "--port", str(port), "--num-products"]
        command += [str(products), "--server", server, "--workers", str(workers), "--max-sessions", "20000"]
        one_thread = {"OMP_NUM_THREADS": "1"}
        with ServerProcess(command, port, "/api/health", timeout_s=600, env=one_thread) as process:
            record = servers[server] = {"workers": workers, "start_s": time.perf_counter() - t0}
            record["memory_idle"] = server_memory(process.pid)
            record["http"] = [bench_http(process.url, episodes, c, s.seconds) for c in (1, 8, 32)]
            record["memory_after_load"] = server_memory(process.pid)
            record["session_memory"] = bench_session_memory(process.url, process.pid, episodes, s.sessions)
    most_rss = lambda v: max(v[when]["max_worker_rss"] for when in ("memory_idle", "memory_after_load"))  # noqa: E731
    worker_rss = {n: most_rss(v) for n, v in servers.items()}
    growth = {n: v["session_memory"]["pss_growth_after_first_1000_pct"] for n, v in servers.items()}
    return {
        "num_products": products,
        "num_goals": engine.num_goals,
        "engine_load_s": load_s,
        "in_process": in_process,
        "servers": servers,
        "targets": {
            "p99_search_step_ms": {
                "target": TARGET_P99_SEARCH_MS,
                "in_process": in_process["search_step"]["p99_ms"],
                "http_1_client_waitress": servers["waitress"]["http"][0]["search_step"]["p99_ms"],
            },
            "worker_rss_bytes": {"target": TARGET_WORKER_BYTES, **worker_rss},
            "pss_growth_pct_over_sessions": growth,
        },
    }


def plot_webshop(result: dict, path: Path) -> None:
    from benchmarks.lib.plots import figure, lines

    servers = result["servers"]
    with figure(path, panels=2) as (latency, memory):
        curves, pss = {}, {}
        for name, srv in servers.items():
            clients = [h["clients"] for h in srv["http"]]
            for p in ("p50", "p99"):
                curves[f"{name}: {p}"] = (clients, [h["all"][f"{p}_ms"] for h in srv["http"]])
            samples = srv["session_memory"]["pss_samples"]
            pss[name] = ([k for k, _ in samples], [b / 2**20 for _, b in samples])
        lines(latency, curves, xlabel="concurrent clients", ylabel="latency (ms)")
        latency.axhline(TARGET_P99_SEARCH_MS, color="grey", linestyle=":")
        latency.set_xscale("log", base=2)
        lines(memory, pss, xlabel="sessions created and closed", ylabel="server PSS, all processes (MiB)")


PARTS = {
    "alfworld": Part(AlfworldSettings, run_alfworld),
    "webshop": Part(WebShopSettings, run_webshop, plot_webshop),
}

SPECS = (
    Benchmark("alfworld", ["alfworld"]),
    Benchmark("webshop", ["webshop"]),
)


main = script_main(__name__, __file__, PARTS, SPECS, __doc__)
