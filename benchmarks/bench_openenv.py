"""Cost of speaking OpenEnv: 32 concurrent OpenEnv sessions against 32 clients of our native protocol.

For each env (ALFWorld on generated games, WebShop on a generated catalog), in one run, on the same machine:

* native: ``progpo serve`` in its own process (waitress, ``--workers`` env workers); ``--clients`` threads,
  each stepping its own ``progpo/Remote-v0`` env (one HTTP connection each), as ``bench_hosting.py`` does;
* OpenEnv: ``progpo serve --protocol openenv`` in its own process (OpenEnv's FastAPI app on uvicorn, the same
  env workers); ``--clients`` sessions of OpenEnv's own ``GenericEnvClient`` (one WebSocket each), all on one
  asyncio loop in this process (the client's native, async form) or, with ``--openenv-client sync``, one
  thread per ``.sync()`` client;
* the same episodes: client ``i`` resets with seed ``i`` and draws admissible actions from
  ``random.Random(i)`` (WebShop's search placeholder becomes a fixed query); an episode that ends is reset;
* steps/s over the whole run (all clients started together) and p50/p99 of the step calls; the claim is the
  ratio OpenEnv/native of the same run: ``throughput_ratio`` (goal: >= 0.8) and ``p99_ratio``.

The two servers run one after the other: first one warm-up round each (not counted: the env workers load
their games and catalogs), then ``--rounds`` rounds, the order swapped every round (native first, then OpenEnv
first, ...) so that a drift in the machine's load falls on both; the numbers are the counted rounds pooled
(steps/s: total steps over total time; latencies: all step calls). The machine is shared (load average
recorded).

Run: ``.venv/bin/python benchmarks/bench_openenv.py`` (a few minutes; ``--quick`` for a smoke run that writes
nothing). Writes ``benchmarks/results/openenv.json`` and ``benchmarks/results/openenv.png``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import progpo_envs  # noqa: F401
from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.hosting import (
    ENVS,
    available_envs,
    choose,
    openenv_actions,
    pooled,
    run_openenv_async,
    start_server,
)
from benchmarks.lib.markdown import markdown_table
from progpo_envs.server.remote import RemoteEnv

ROOT = Path(__file__).resolve().parents[1]

RESULT = RESULTS_DIR / "openenv.json"
PLOT = RESULTS_DIR / "openenv.png"
#: The throughput the OpenEnv protocol should keep, as a share of the native protocol's (issue 26).
TARGET_RATIO = 0.8
#: Steps per round (all clients): ALFWorld steps (and game loads on reset) are ~100x slower than WebShop's.
DEFAULT_STEPS = {"progpo/ALFWorld-v0": 512, "progpo/WebShop-v0": 2560}


def run_threads(client, clients: int, barrier: threading.Barrier) -> float:
    """Run ``client(i)`` for ``i < clients`` in threads that all wait on ``barrier``; the seconds from their
    release to the last one's end."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def run_native(url: str, env_id: str, clients: int, steps_each: int) -> dict:
    """``clients`` threads, each stepping its own ``progpo/Remote-v0`` env."""
    envs = [RemoteEnv(url, env_id) for _ in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    infos = [env.reset(seed=i)[1] for i, env in enumerate(envs)]
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        rng, env, info = random.Random(i), envs[i], infos[i]
        barrier.wait()
        try:
            for _ in range(steps_each):
                t0 = time.perf_counter()
                _, _, terminated, truncated, info = env.step(choose(info["admissible_actions"], rng))
                if terminated or truncated:
                    info = env.reset()[1]
                latencies[i].append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            errors.append(repr(exc))

    elapsed = run_threads(client, clients, barrier)
    for env in envs:
        env.close()
    return {"latencies": [x for per in latencies for x in per], "elapsed_s": elapsed, "errors": errors}


def run_openenv_sync(url: str, clients: int, steps_each: int) -> dict:
    """``clients`` threads, each with its own ``GenericEnvClient(...).sync()`` session."""
    from openenv import GenericEnvClient

    sessions = [GenericEnvClient(base_url=url, message_timeout_s=600).sync() for _ in range(clients)]
    firsts = [s.reset(seed=i).observation for i, s in enumerate(sessions)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        rng, session, observation = random.Random(i), sessions[i], firsts[i]
        barrier.wait()
        try:
            for _ in range(steps_each):
                t0 = time.perf_counter()
                result = session.step({"command": choose(openenv_actions(observation), rng)})
                observation = result.observation
                if result.done:
                    observation = session.reset().observation
                latencies[i].append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            errors.append(repr(exc))

    elapsed = run_threads(client, clients, barrier)
    for session in sessions:
        session.close()
    return {"latencies": [x for per in latencies for x in per], "elapsed_s": elapsed, "errors": errors}


def plot(results: dict, clients: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [env_id.split("/")[-1] for env_id in results]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "steps_per_s", "steps/s"), (axes[1], "p99_ms", "p99 step latency (ms)")):
        for offset, protocol in ((-0.2, "native"), (0.2, "openenv")):
            values = [results[env_id][protocol][key] for env_id in results]
            ax.bar([i + offset for i in range(len(names))], values, width=0.4, label=protocol)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(f"{clients} concurrent sessions: OpenEnv protocol vs native (same machine, same run)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


@dataclass
class Settings:
    clients: int = option(32, "concurrent sessions per protocol")
    steps: int | None = option(None, "steps per round, all clients (default: per env)")
    rounds: int = option(3, "counted rounds per protocol (after a warm-up)")
    workers: int = option(2, "env worker processes of each server")
    envs: list[str] | None = option(None, "only these env ids", flag="--env", action="append", nargs=None)
    openenv_client: str = option(
        "async",
        "OpenEnv sessions on one asyncio loop (async) or one thread per .sync() client",
        choices=["async", "sync"],
    )
    quick: bool = option(False, "a smoke run: few steps, one round, no files")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    if settings.quick:
        settings = dataclasses.replace(settings, steps=64, rounds=1, clients=8)
    console = Console()
    results: dict = {}
    for env_id in available_envs(settings.envs or list(ENVS), console):
        steps_each = max(4, (settings.steps or DEFAULT_STEPS[env_id]) // settings.clients)
        runs: dict[str, list[dict]] = {"native": [], "openenv": []}
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{env_id}: starting both servers", total=2 * (settings.rounds + 1))
            servers = {p: start_server(env_id, settings.workers, p) for p in ("native", "openenv")}
            try:
                for round_index in range(-1, settings.rounds):  # round -1: the warm-up
                    order = ("native", "openenv") if round_index % 2 == 0 else ("openenv", "native")
                    for protocol in order:
                        label = "warm-up" if round_index < 0 else f"round {round_index + 1}"
                        progress.update(task, description=f"{env_id}: {label}, {protocol}")
                        url = servers[protocol].url
                        if protocol == "native":
                            run = run_native(url, env_id, settings.clients, steps_each)
                        elif settings.openenv_client == "async":
                            run = run_openenv_async(url, settings.clients, steps_each)
                        else:
                            run = run_openenv_sync(url, settings.clients, steps_each)
                        if round_index >= 0:
                            runs[protocol].append(run)
                        progress.advance(task)
            finally:
                for server in servers.values():
                    server.stop()
        native, openenv = pooled(runs["native"]), pooled(runs["openenv"])
        results[env_id] = {
            "native": native,
            "openenv": openenv,
            "throughput_ratio": openenv["steps_per_s"] / native["steps_per_s"],
            "p99_ratio": openenv["p99_ms"] / native["p99_ms"],
            "p50_ratio": openenv["p50_ms"] / native["p50_ms"],
        }
    table = Table(title=f"OpenEnv vs native protocol, {settings.clients} concurrent sessions")
    for column in [
        "env",
        "native steps/s",
        "OpenEnv steps/s",
        "ratio",
        "native p50/p99 ms",
        "OpenEnv p50/p99 ms",
    ]:
        table.add_column(column, justify="left" if column == "env" else "right")
    table.add_column("errors", justify="right")
    for env_id, row in results.items():
        n, o = row["native"], row["openenv"]
        table.add_row(
            env_id.split("/")[-1],
            f"{n['steps_per_s']:.1f}",
            f"{o['steps_per_s']:.1f}",
            f"{row['throughput_ratio']:.2f}",
            f"{n['p50_ms']:.1f} / {n['p99_ms']:.1f}",
            f"{o['p50_ms']:.1f} / {o['p99_ms']:.1f}",
            f"{len(n['errors'])} / {len(o['errors'])}",
        )
    console.print(table)
    if settings.quick or not results:
        return 0
    payload = {
        "benchmark": "openenv",
        "command": "python benchmarks/bench_openenv.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "clients": settings.clients,
            "steps_per_round": settings.steps or {env_id: DEFAULT_STEPS[env_id] for env_id in results},
            "rounds": settings.rounds,
            "workers": settings.workers,
            "openenv_client": settings.openenv_client,
            "env_kwargs": {env_id: ENVS[env_id] for env_id in results},
        },
        "target_throughput_ratio": TARGET_RATIO,
        "notes": (
            "Both servers are `progpo serve` in their own process on loopback with the same env workers; "
            "native: waitress, one progpo/Remote-v0 client thread per session; OpenEnv: OpenEnv's app on "
            "uvicorn, OpenEnv's GenericEnvClient per session (openenv_client: one asyncio loop, or threads). "
            "The clients run in the benchmark's process on the same 2 cores as the servers. Rounds alternate "
            "native/OpenEnv and are pooled. throughput_ratio = OpenEnv steps/s / native steps/s; p99_ratio "
            "likewise for p99 latency (lower is better). The machine is shared (see load_average)."
        ),
        "machine": machine_info(processor=platform.processor(), load_average=list(os.getloadavg())),
        "results": results,
    }
    save_result(payload, RESULT)
    plot(results, settings.clients)
    lines = [f"wrote {RESULT.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}"]
    for env_id, row in results.items():
        verdict = "meets" if row["throughput_ratio"] >= TARGET_RATIO else "below"
        lines.append(
            f"  {env_id}: OpenEnv/native throughput x{row['throughput_ratio']:.2f} ({verdict} the "
            f"{TARGET_RATIO} goal), p99 x{row['p99_ratio']:.2f}"
        )
    console.print("\n".join(lines))
    return 0


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------


def render_openenv(data: dict) -> str:
    rows = [
        [
            env_id,
            r["native"]["steps_per_s"],
            r["openenv"]["steps_per_s"],
            r["throughput_ratio"],
            r["native"]["p99_ms"],
            r["openenv"]["p99_ms"],
            r["p99_ratio"],
            r["throughput_ratio"] >= data["target_throughput_ratio"],
            len(r["native"]["errors"]) + len(r["openenv"]["errors"]),
        ]
        for env_id, r in data["results"].items()
    ]
    clients = data["settings"]["clients"]
    return f"{clients} concurrent sessions per protocol. {data.get('notes', '')}\n\n" + markdown_table(
        [
            "env",
            "native steps/s",
            "OpenEnv steps/s",
            "throughput ratio",
            "native p99 ms",
            "OpenEnv p99 ms",
            "p99 ratio",
            f"ratio >= {data['target_throughput_ratio']}",
            "errors",
        ],
        rows,
    )


SPECS = (
    Benchmark(
        "openenv",
        script_path(__file__),
        "The OpenEnv protocol (`progpo serve --protocol openenv`: OpenEnv's own server, `GenericEnvClient` "
        "sessions) against our native protocol on the same machine in one run: steps/s and p99 step latency "
        "with many concurrent sessions on ALFWorld and WebShop; claim: OpenEnv keeps the share of the native "
        "throughput that the result file names as its goal (`target_throughput_ratio`).",
        "python benchmarks/bench_openenv.py",
        ["--quick"],
        render_openenv,
    ),
)


if __name__ == "__main__":
    sys.exit(main())
