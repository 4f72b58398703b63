"""A soak as long as a training run: a GPU preset's env traffic against a fleet of env servers, faults on a
schedule (what it plays, samples and must hold: docs/hosting.md, "the soak"). ``python benchmarks/soak.py``
(about 25 minutes on 2 cores) writes ``benchmarks/results/soak.json`` and ``soak.png``; ``--quick`` is
``.ci/run``'s shortened soak (each fault once, ≥ 100 MiB through one connection; under ``runs/bench_quick/``).
"""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import gymnasium as gym
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import progpo_envs  # noqa: F401  (registers the envs)
from benchmarks.common import ROOT, ServerProcess, free_port
from benchmarks.harness import Benchmark, Part, option, script_main, settings_record
from benchmarks.lib.hosting import choose, serve_command
from benchmarks.lib.markdown import markdown_table
from benchmarks.lib.processes import Sampler, tree
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.fleet import NoServerError
from progpo_envs.server.remote import ServerUnavailableError, largest_stream_connections
from training.config import load_config

PRESETS = {
    "progpo/WebShop-v0": "configs/webshop_progpo_qwen2.5-1.5b.yaml",
    "progpo/ALFWorld-v0": "configs/alfworld_progpo_qwen2.5-1.5b.yaml",
}
#: The servers' env kwargs besides the preset's split and step limit (WebShop: the generated catalog).
SERVER_KWARGS = {"progpo/WebShop-v0": {"num_products": 1000}, "progpo/ALFWorld-v0": {}}
FAULTS = ("kill", "stop", "restart", "drain")
#: Where in the planned vector steps each fault starts, once the window (fault to its server back + 30 s:
#: what its ``max_stall_s`` covers) of the one before closed: one fault at a time, on a whole fleet.
FAULT_AT, FAULT_WINDOW_S = (0.2, 0.4, 0.6, 0.8), 30.0
#: How far past its iterations a run may go for its bytes (the faults, each bounded in time, are awaited).
EXTRA_ITERATIONS_CAP = 40
MAX_STALL_S, MAX_STALL_S_QUICK, MAX_RSS_GROWTH = 15.0, 30.0, 0.10
MIB = 1 << 20


@dataclass
class Settings:
    envs: list[str] = option(list(PRESETS), "envs to soak, each with its GPU preset's traffic", flag="--env")
    servers: int = option(3, "progpo serve servers in the fleet (faults fall on the first two)")
    workers: int = option(2, "env workers per server")
    iterations: int = option(0, "training iterations of traffic (0: the preset's)")
    min_connection_mib: int = option(512, "run past the iterations until one connection carried this much")
    stop_s: float = option(60.0, "seconds a stopped server stays stopped")
    down_s: float = option(15.0, "seconds a killed or drained server stays down")
    seed: int = option(0, "task and action draws")
    quick: bool = option(False, ".ci/run's shortened soak: 12 iterations, 100 MiB, a 45 s stop, 5 s down")
    out: Path | None = option(None, "result file (default: benchmarks/results/soak.json; its plot beside it)")

    def __post_init__(self):
        if unknown := sorted(set(self.envs) - set(PRESETS)):
            raise ValueError(f"no preset for {unknown}; choose from {sorted(PRESETS)}")
        if self.servers < 3:
            raise ValueError("--servers must be at least 3 (two take the faults, one keeps its connection)")
        if self.quick:
            self.iterations, self.min_connection_mib = self.iterations or 12, 100
            self.stop_s, self.down_s = 45.0, 5.0


class Member:
    """One ``progpo serve`` of the fleet, on a port it keeps across restarts."""

    #: Ports taken in this process: each env's fleet its own (the client counts bytes per server URL).
    ports_taken: set[int] = set()

    def __init__(self, env_id: str, workers: int, env_kwargs: dict):
        self.port = next(port for port in iter(free_port, None) if port not in Member.ports_taken)
        Member.ports_taken.add(self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = serve_command(env_id, workers, self.port, kwargs=env_kwargs)
        self.server: ServerProcess | None = None
        self.start()

    def start(self) -> None:
        self.server = ServerProcess(self.command, self.port, ready_path="/ready", timeout_s=900)

    def processes(self) -> list[psutil.Process]:
        """The server and its env workers (empty while it is down)."""
        up = self.server is not None and self.server.process.poll() is None
        return tree(self.server.pid) if up else []

    def fault(self, kind: str, settings: Settings) -> None:
        """Apply fault ``kind`` and bring the server back (docs/hosting.md, "the soak")."""
        process = self.server.process
        if kind == "stop":
            process.send_signal(signal.SIGSTOP)
            time.sleep(settings.stop_s)
            process.send_signal(signal.SIGCONT)
            return
        if kind == "kill":  # the whole tree, as a container's kill does
            for member in reversed(self.processes()):
                member.kill()
        else:  # restart, drain: SIGTERM, the server drains and exits
            process.send_signal(signal.SIGTERM)
        process.wait(120)
        self.server.stop()
        if kind != "restart":
            time.sleep(settings.down_s)
        self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def growth(samples: dict, run_s: float) -> tuple[float, str, int]:
    """``(rss_growth, its process, fds_growth)``: per process, from 10% of its life in the run (at least 10%
    into the run) to its last sample; processes sampled over less than a quarter of the run are left out."""
    rss_growth, where, fds_growth = 0.0, "", 0
    for series in samples.values():
        points = series["points"]
        first, last = points[0][0], points[-1][0]
        if last - first < 0.25 * run_s:
            continue
        start = max(0.1 * run_s, first + 0.1 * (last - first))
        reference = next(p for p in points if p[0] >= start)
        relative = points[-1][1] / reference[1] - 1
        if relative > rss_growth:
            rss_growth, where = relative, series["label"]
        fds_growth = max(fds_growth, points[-1][2] - reference[2])
    return rss_growth, where, fds_growth


def soak_env(env_id: str, settings: Settings, console: Console) -> dict:
    config = load_config(ROOT / PRESETS[env_id])
    groups, group_size, max_steps = config.rollout.num_groups, config.rollout.group_size, config.env.max_steps
    iterations = settings.iterations or config.iterations
    planned_steps, copies = iterations * max_steps, groups * group_size
    env_kwargs = {**SERVER_KWARGS[env_id], "split": config.env.train_split, "max_steps": max_steps}
    console.print(f"[bold]{env_id}[/]: {copies} copies, {iterations} iterations of {max_steps} steps")
    fleet = [Member(env_id, settings.workers, env_kwargs) for _ in range(settings.servers)]
    ports = {member.port for member in fleet}
    started = time.monotonic()
    clock = lambda: time.monotonic() - started  # noqa: E731
    samples: dict = {}

    def sample() -> None:  # every fleet process: {pid: {"label", "points": [(t, rss, fds)]}}
        for index, member in enumerate(fleet):
            for rank, process in enumerate(member.processes()):
                try:
                    with process.oneshot():
                        point = (clock(), process.memory_info().rss, process.num_fds())
                except psutil.Error:
                    continue
                label = f"server {index}" + ("" if rank == 0 else f" worker {process.pid}")
                samples.setdefault(process.pid, {"label": label, "points": []})["points"].append(point)

    sampler = Sampler(sample, 2.0).start()
    fleet_env = {"url": [m.url for m in fleet], "env_id": env_id, "transport": "stream"}
    envs = gym.make_vec(REMOTE_ENV_ID, num_envs=copies, group_size=group_size, **fleet_env)
    num_tasks = envs.unwrapped.call("num_tasks")[0]
    rng = random.Random(settings.seed)
    episodes = {"planned": 0, "finished": 0, "failed_by_fault": 0, "lost": 0}
    calls: list[tuple[float, float, int]] = []  # (start, seconds, env steps) of every vector step or reset
    failures: list[float] = []  # when each episode failed by a fault
    faults: list[dict] = []
    fault_threads: list[threading.Thread] = []

    def timed(steps: int, call, *args, **kwargs):
        begun = clock()
        result = call(*args, **kwargs)
        calls.append((begun, clock() - begun, steps))
        return result

    def start_fault(index: int) -> None:
        kind, member = FAULTS[index], fleet[index % 2]
        record = {"kind": kind, "server": member.url, "at_s": round(clock(), 1)}
        faults.append(record)

        def run() -> None:
            try:  # back_s even if the server does not start again: the run goes on without it
                member.fault(kind, settings)
            finally:
                record["back_s"] = round(clock(), 1)

        fault_threads.append(threading.Thread(target=run, name=f"fault-{kind}", daemon=True))
        fault_threads[-1].start()

    def fault_due() -> bool:  # the next fault's place in the steps reached, the window before it closed
        due = len(faults) < len(FAULTS) and vector_steps >= FAULT_AT[len(faults)] * planned_steps
        return due and (not faults or clock() >= faults[-1].get("back_s", float("inf")) + FAULT_WINDOW_S)

    def carried() -> int:  # the most one connection to this env's fleet carried
        counts = largest_stream_connections().items()
        return max((n for url, n in counts if urlsplit(url).port in ports), default=0)

    vector_steps = iteration = 0
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    with Progress(TextColumn("{task.description}"), *columns, console=console) as progress:
        task = progress.add_task(f"soak {env_id}", total=planned_steps, status="")
        min_bytes = settings.min_connection_mib * MIB
        faults_left = lambda: len(faults) < len(FAULTS) or "back_s" not in faults[-1]  # noqa: E731
        cap = EXTRA_ITERATIONS_CAP * iterations
        while iteration < iterations or faults_left() or (carried() < min_bytes and iteration < cap):
            iteration += 1
            episodes["planned"] += copies
            options = {"task_indices": [rng.randrange(num_tasks) for _ in range(groups)]}
            while True:  # a reset fails only when no server can take a group: wait for one to come back
                try:
                    seed = rng.randrange(1 << 30)
                    _, infos = timed(0, envs.unwrapped.reset_copies, seed=seed, options=options)
                    break
                except (NoServerError, ServerUnavailableError) as exc:
                    progress.update(task, status=f"[yellow]reset waits: {str(exc)[:60]}")
                    time.sleep(2.0)
            live = list(range(copies))
            for _ in range(max_steps):
                if fault_due():
                    start_fault(len(faults))
                actions = [choose(list(infos[i]["admissible_actions"]), rng) for i in live]
                stepped = timed(len(live), envs.unwrapped.step_some, live, actions)
                _, _, terminated, truncated, step_infos = stepped
                vector_steps += 1
                still = []
                for k, i in enumerate(live):
                    infos[i] = step_infos[k]
                    if "env_error" in step_infos[k]:
                        episodes["failed_by_fault"] += 1
                        failures.append(clock())
                    elif terminated[k] or truncated[k]:
                        episodes["finished"] += 1
                    else:
                        still.append(i)
                live = still
                if not live:
                    break
            episodes["lost"] += len(live)  # an episode the env did not end within its own step limit
            status = f"it {iteration} · {carried() / MIB:.0f} MiB on one connection · {len(faults)} faults"
            progress.update(task, completed=min(vector_steps, planned_steps), status=status)
            if not console.is_terminal:  # a log file: rich draws only its last state there
                steps = f"{vector_steps}/{planned_steps} vector steps"
                console.print(f"soak {env_id}: {status} · {steps} · {clock() / 60:.1f} min")
    for thread in fault_threads:
        thread.join()
    wall_s = clock()
    servers = envs.unwrapped.servers()
    envs.close()
    sampler.stop()
    for member in fleet:
        member.stop()
    for index, record in enumerate(faults):
        until = record["back_s"] + FAULT_WINDOW_S
        overlapping = [s for begun, s, _ in calls if begun <= until and begun + s >= record["at_s"]]
        record["max_stall_s"] = round(max(overlapping, default=0.0), 2)
        next_at = faults[index + 1]["at_s"] if index + 1 < len(faults) else wall_s
        record["episodes_failed"] = sum(record["at_s"] <= t < next_at for t in failures)
    rss_growth, rss_where, fds_growth = growth(samples, wall_s)
    mib = lambda points: [(round(t, 1), round(b / MIB, 1)) for t, b, _ in points]  # noqa: E731
    rss = {series["label"]: mib(series["points"]) for series in samples.values()}
    return {
        "preset": PRESETS[env_id],
        "num_envs": copies,
        "group_size": group_size,
        "max_steps": max_steps,
        "iterations": iteration,
        "planned_vector_steps": planned_steps,
        "vector_steps": vector_steps,
        "env_steps": sum(n for _, _, n in calls),
        "episodes": episodes,
        "max_connection_bytes": carried(),
        "faults": faults,
        "rss_growth": round(rss_growth, 4),
        "rss_growth_process": rss_where,
        "fds_growth": fds_growth,
        "wall_s": round(wall_s, 1),
        "vector_step_p50_ms": round(1000 * statistics.median(s for _, s, n in calls if n), 1),
        "servers_at_end": servers,
        "series": {"throughput": throughput(calls, wall_s), "rss_mib": rss},
    }


def throughput(calls: list[tuple[float, float, int]], wall_s: float, window_s: float = 10.0) -> list:
    """Env steps per second in windows of ``window_s``: ``[(window start, steps/s)]``."""
    bins = [0] * (int(wall_s // window_s) + 1)
    for begun, seconds, steps in calls:
        bins[int((begun + seconds) // window_s)] += steps
    return [(i * window_s, round(n / window_s, 1)) for i, n in enumerate(bins)]


def checks(result: dict, settings: Settings) -> list[str]:
    """What failed of the must-holds (docs/hosting.md, "the soak")."""
    failed, max_stall = [], result["bounds"]["max_stall_s"]
    for env_id, r in result["envs"].items():
        if r["episodes"]["lost"]:
            failed.append(f"{env_id}: {r['episodes']['lost']} episodes lost")
        if r["max_connection_bytes"] < settings.min_connection_mib * MIB:
            most = r["max_connection_bytes"] / MIB
            failed.append(f"{env_id}: one connection carried {most:.0f} MiB at most")
        if sorted(f["kind"] for f in r["faults"]) != sorted(FAULTS):
            failed.append(f"{env_id}: faults {[f['kind'] for f in r['faults']]}")
        stalls = [f for f in r["faults"] if f["max_stall_s"] > max_stall]
        failed += [f"{env_id}: {f['kind']} stalled a vector call {f['max_stall_s']} s" for f in stalls]
        if not settings.quick and r["rss_growth"] > MAX_RSS_GROWTH:
            failed.append(f"{env_id}: RSS of {r['rss_growth_process']} grew {r['rss_growth']:.1%}")
    return failed


def run(settings: Settings) -> dict:
    """A GPU preset's env traffic over a fleet of servers with kill, stop, restart and drain faults."""
    console = Console()
    envs = {env_id: soak_env(env_id, settings, console) for env_id in settings.envs}
    result = {"settings": settings_record(settings), "envs": envs}
    result["bounds"] = {
        "min_connection_bytes": settings.min_connection_mib * MIB,
        "max_stall_s": MAX_STALL_S_QUICK if settings.quick else MAX_STALL_S,
        "max_rss_growth": None if settings.quick else MAX_RSS_GROWTH,
    }
    return {**result, "failed": checks(result, settings)}


def plot(result: dict, path: Path) -> None:
    """Per env: each process's RSS and the env steps/s over the run, the faults shaded."""
    from benchmarks.lib.plots import figure

    envs = result["envs"]
    with figure(path, panels=len(envs), rows=2, width=6.5, height=3.25, sharex="col") as axes:
        for (rss, speed), (env_id, r) in zip(zip(*axes, strict=True), envs.items(), strict=True):
            for label, points in r["series"]["rss_mib"].items():
                rss.plot(*zip(*points, strict=True), lw=0.8, label=None if "worker" in label else label)
            speed.plot(*zip(*r["series"]["throughput"], strict=True), lw=0.8, color="black")
            for fault in r["faults"]:
                for ax in (rss, speed):
                    ax.axvspan(fault["at_s"], fault["back_s"], color="red", alpha=0.12)
                speed.annotate(fault["kind"], (fault["at_s"], 0), fontsize=7, rotation=90, va="bottom")
            rss.set(title=f"{env_id}: RSS per process (red: a fault)", ylabel="MiB")
            rss.legend(fontsize=7)
            speed.set(title="env steps/s (10 s windows)", xlabel="seconds into the run", ylabel="steps/s")


def render_soak(data: dict) -> str:
    header = ["env", "vector steps", "wall", "episodes", "finished", "failed by a fault", "lost"]
    header += ["most on one connection", "faults (max stall / episodes failed)", "RSS growth", "fds growth"]
    rows = []
    for env_id, r in data["envs"].items():
        e = r["episodes"]
        faults = [f"{f['kind']} {f['max_stall_s']:.1f} s/{f['episodes_failed']}" for f in r["faults"]]
        rows.append([env_id, r["vector_steps"], f"{r['wall_s'] / 60:.0f} min", e["planned"], e["finished"]])
        rows[-1] += [e["failed_by_fault"], e["lost"], f"{r['max_connection_bytes'] / MIB:.0f} MiB"]
        rows[-1] += [", ".join(faults), f"{r['rss_growth']:.1%}", r["fds_growth"]]
    return markdown_table(header, rows)


SPECS = (Benchmark("soak", render=render_soak),)


main = script_main(__name__, __file__, Part(Settings, run, plot, "soak"), SPECS, __doc__)
