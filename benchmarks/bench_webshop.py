"""Speed and memory of the self-hosted WebShop: the in-process env, the HTTP server, memory per worker.

Claims measured (issue 4): a search step's p99 latency is under 20 ms at 100k products; a server worker holds
under 1 GB at 100k products; memory does not grow over 10,000 sessions created and closed. Reported:

* in-process env (``WebShopEnv`` over the shared engine): steps/s replaying expert episodes, the latency of
  search steps (search cache cleared first) against the bare tantivy query on the same queries (the baseline:
  the ratio is the engine's overhead over the index);
* the production servers (``progpo webshop serve``, in a subprocess on loopback): waitress (one process,
  8 threads, sessions in memory) and gunicorn (2 processes forked after loading, sessions in SQLite):
  requests/s and p50/p99 latency with 1, 8 and 32 concurrent clients replaying expert episodes over the JSON
  API, and memory per worker (RSS; USS = what a worker does not share with the others);
* memory of each server (PSS summed over its processes) sampled over 10,000 sessions created, searched
  and closed.

Catalog generation and index build times are measured by ``benchmarks/bench_webshop_data.py``.

Run: ``nice .venv/bin/python benchmarks/bench_webshop.py`` (100k products; generates and caches the catalog on
first use; ~3–5 minutes on 2 cores), or ``--num-products 10000`` for a quicker look.
Writes ``benchmarks/results/webshop.json`` and ``webshop.png``.
"""

from __future__ import annotations

import os
import sys
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
from rich.table import Table

from benchmarks.common import RESULTS_DIR, ServerProcess, free_port, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from progpo_envs.webshop.env import WebShopEnv
from webshop_server.engine import WebShopEngine, split_range
from webshop_server.expert import expert_action

ROOT = Path(__file__).resolve().parents[1]

TARGET_P99_SEARCH_MS = 20.0
TARGET_WORKER_BYTES = 1 << 30
console = Console()


def percentiles(values_s: list[float]) -> dict[str, float]:
    arr = np.asarray(values_s) * 1000.0
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "n": int(arr.size),
    }


def expert_episodes(engine: WebShopEngine, goals: range) -> tuple[list[tuple[int, list[str]]], list[float]]:
    """The expert's action list per goal (recorded once, replayed by every measurement), and its scores."""
    episodes, scores = [], []
    for goal_index in track(goals, description="record expert episodes", console=console):
        session, actions = engine.new_session(goal_index), []
        while (action := expert_action(engine, session)) is not None and len(actions) < 15:
            engine.step(session, action)
            actions.append(action)
        episodes.append((goal_index, actions))
        scores.append(session.score or 0.0)
    return episodes, scores


def bench_in_process(engine: WebShopEngine, episodes) -> dict:
    env = WebShopEnv(engine=engine, split="all")
    engine.clear_search_cache()
    search_steps, other_steps, total_steps = [], [], 0
    start = time.perf_counter()
    for goal_index, actions in track(episodes, description="in-process env", console=console):
        env.reset(options={"task_index": goal_index})
        for action in actions:
            t0 = time.perf_counter()
            env.step(action)
            (search_steps if action.startswith("search[") else other_steps).append(time.perf_counter() - t0)
            total_steps += 1
    elapsed = time.perf_counter() - start
    index_only = []
    for _, actions in episodes:
        query = actions[0][len("search[") : -1]
        t0 = time.perf_counter()
        engine.index.search(query, top_k=50)
        index_only.append(time.perf_counter() - t0)
    search, bare = percentiles(search_steps), percentiles(index_only)
    return {
        "steps": total_steps,
        "episodes": len(episodes),
        "steps_per_s": total_steps / elapsed,
        "search_step": search,
        "other_step": percentiles(other_steps),
        "index_search_baseline": bare,
        "search_step_over_index_p50": search["p50_ms"] / bare["p50_ms"],
    }


def start_server(num_products: int, server: str, workers: int) -> ServerProcess:
    """``progpo webshop serve`` with ``server`` (waitress or gunicorn) in its own process, ready (loading
    ``num_products`` products takes most of the wait)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "webshop_server.cli",
        "serve",
        "--port",
        str(port),
        "--num-products",
        str(num_products),
        "--server",
        server,
        "--workers",
        str(workers),
        "--max-sessions",
        "20000",
    ]
    return ServerProcess(command, port, ready_path="/api/health", timeout_s=600, env={"OMP_NUM_THREADS": "1"})


def client_loop(url: str, episodes, seed: int, stop_at: float, records: list, lock: threading.Lock) -> None:
    http = requests.Session()
    rng = np.random.default_rng(seed)
    local = []
    while time.perf_counter() < stop_at:
        goal_index, actions = episodes[int(rng.integers(len(episodes)))]
        t0 = time.perf_counter()
        sid = http.post(url + "/api/sessions", json={"goal_index": goal_index, "split": "all"}).json()[
            "session_id"
        ]
        local.append(("create", time.perf_counter() - t0))
        for action in actions:
            t0 = time.perf_counter()
            reply = http.post(f"{url}/api/sessions/{sid}/step", json={"action": action})
            assert reply.ok, reply.text
            local.append(("search" if action.startswith("search[") else "click", time.perf_counter() - t0))
        t0 = time.perf_counter()
        http.delete(f"{url}/api/sessions/{sid}")
        local.append(("close", time.perf_counter() - t0))
    with lock:
        records.extend(local)


def bench_http(url: str, episodes, clients: int, seconds: float) -> dict:
    records, lock = [], threading.Lock()
    stop_at = time.perf_counter() + seconds
    threads = [
        threading.Thread(target=client_loop, args=(url, episodes, i, stop_at, records, lock))
        for i in range(clients)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {
        "clients": clients,
        "requests": len(records),
        "requests_per_s": len(records) / elapsed,
        "all": percentiles([d for _, d in records]),
        "search_step": percentiles([d for kind, d in records if kind == "search"]),
    }


def server_memory(pid: int) -> dict:
    """RSS, USS and PSS of the server's processes (waitress: one; gunicorn: the master and its workers)."""
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    info = [(p.pid, p.memory_full_info()) for p in processes]
    workers = info[1:] or info  # gunicorn workers are the children; waitress serves from the root process
    return {
        "processes": [{"pid": p, "rss": m.rss, "uss": m.uss, "pss": m.pss} for p, m in info],
        "total_rss": sum(m.rss for _, m in info),
        "total_pss": sum(m.pss for _, m in info),
        "max_worker_rss": max(m.rss for _, m in workers),
        "max_worker_uss": max(m.uss for _, m in workers),
    }


def bench_session_memory(url: str, pid: int, episodes, total: int, clients: int = 8) -> dict:
    def tree_pss() -> int:  # proportional set size: pages shared by the processes are counted once
        return server_memory(pid)["total_pss"]

    per_client = total // clients
    samples: list[tuple[int, int]] = [(0, tree_pss())]
    done = [0]
    lock = threading.Lock()

    def worker(seed: int) -> None:
        http = requests.Session()
        for i in range(per_client):
            goal_index, actions = episodes[(seed * per_client + i) % len(episodes)]
            sid = http.post(url + "/api/sessions", json={"goal_index": goal_index, "split": "all"}).json()[
                "session_id"
            ]
            http.post(f"{url}/api/sessions/{sid}/step", json={"action": actions[0]})
            http.delete(f"{url}/api/sessions/{sid}")
            with lock:
                done[0] += 1
                if done[0] % 1000 == 0:
                    samples.append((done[0], tree_pss()))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples.append((done[0], tree_pss()))
    sessions_left = requests.get(url + "/api/health").json()["sessions"]
    warm = samples[1][1]  # after the first 1000: caches and allocator pools are warm
    return {
        "sessions": done[0],
        "pss_samples": samples,
        "pss_growth_after_first_1000_bytes": samples[-1][1] - warm,
        "pss_growth_after_first_1000_pct": 100.0 * (samples[-1][1] - warm) / warm,
        "sessions_open_at_end": sessions_left,
    }


@dataclass
class Settings:
    num_products: int = option(100_000, "catalog size")
    episodes: int = option(300, "expert episodes replayed")
    seconds: float = option(4.0, "duration of each HTTP concurrency level")
    sessions: int = option(10_000, "sessions for the memory-growth check")
    threads: int = option(8, "waitress worker threads")
    processes: int = option(2, "gunicorn worker processes")
    out: Path = option(RESULTS_DIR / "webshop.json", "result file")


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])

    console.print(f"[bold]WebShop benchmark[/] at {settings.num_products:,} products")
    t0 = time.perf_counter()
    engine = WebShopEngine.shared(settings.num_products, 0)
    load_s = time.perf_counter() - t0
    goals = split_range("all", engine.num_goals)[: settings.episodes]
    episodes, expert_scores = expert_episodes(engine, goals)
    in_process = bench_in_process(engine, episodes)
    in_process["expert"] = {
        "episodes": len(expert_scores),
        "mean_score": float(np.mean(expert_scores)),
        "success_rate": float(np.mean(np.asarray(expert_scores) == 1.0)),
        "mean_steps": float(np.mean([len(a) for _, a in episodes])),
    }

    servers = {}
    for server, workers in (("waitress", settings.threads), ("gunicorn", settings.processes)):
        t0 = time.perf_counter()
        process = start_server(settings.num_products, server, workers)
        start_s = time.perf_counter() - t0
        with process:
            memory_idle = server_memory(process.pid)
            http = [bench_http(process.url, episodes, c, settings.seconds) for c in (1, 8, 32)]
            memory_loaded = server_memory(process.pid)
            sessions = bench_session_memory(process.url, process.pid, episodes, settings.sessions)
        servers[server] = {
            "workers": workers,
            "start_s": start_s,
            "http": http,
            "memory_idle": memory_idle,
            "memory_after_load": memory_loaded,
            "session_memory": sessions,
        }

    waitress = servers["waitress"]
    results = {
        "machine": machine_info(load_avg_1m=os.getloadavg()[0]),
        "num_products": settings.num_products,
        "num_goals": engine.num_goals,
        "engine_load_s": load_s,
        "in_process": in_process,
        "servers": servers,
        "targets": {
            "p99_search_step_ms": {
                "target": TARGET_P99_SEARCH_MS,
                "in_process": in_process["search_step"]["p99_ms"],
                "http_1_client_waitress": waitress["http"][0]["search_step"]["p99_ms"],
            },
            "worker_rss_bytes": {
                "target": TARGET_WORKER_BYTES,
                **{
                    name: max(
                        srv["memory_idle"]["max_worker_rss"], srv["memory_after_load"]["max_worker_rss"]
                    )
                    for name, srv in servers.items()
                },
            },
            "pss_growth_pct_over_sessions": {
                name: srv["session_memory"]["pss_growth_after_first_1000_pct"]
                for name, srv in servers.items()
            },
        },
    }
    save_result(results, settings.out)

    table = Table(title=f"WebShop at {settings.num_products:,} products ({os.cpu_count()} CPUs)")
    for column in ("measurement", "value", "p50 ms", "p99 ms"):
        table.add_column(column)
    s = in_process["search_step"]
    table.add_row("in-process env", f"{in_process['steps_per_s']:.0f} steps/s", "", "")
    expert = in_process["expert"]
    table.add_row("  expert success", f"{expert['success_rate']:.1%} of {expert['episodes']} goals", "", "")
    table.add_row("  search step", "", f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}")
    b = in_process["index_search_baseline"]
    table.add_row(
        "  bare index query (baseline)",
        f"step/index p50 = {in_process['search_step_over_index_p50']:.2f}x",
        f"{b['p50_ms']:.2f}",
        f"{b['p99_ms']:.2f}",
    )
    for name, srv in servers.items():
        unit = "threads" if name == "waitress" else "processes"
        for level in srv["http"]:
            table.add_row(
                f"{name} ({srv['workers']} {unit}), {level['clients']} clients",
                f"{level['requests_per_s']:.0f} req/s",
                f"{level['all']['p50_ms']:.2f}",
                f"{level['all']['p99_ms']:.2f}",
            )
            table.add_row(
                "  search step",
                "",
                f"{level['search_step']['p50_ms']:.2f}",
                f"{level['search_step']['p99_ms']:.2f}",
            )
        memory = srv["memory_after_load"]
        table.add_row(
            f"{name} memory per worker (RSS / USS)",
            f"{memory['max_worker_rss'] / 2**20:.0f} / {memory['max_worker_uss'] / 2**20:.0f} MiB",
            "",
            "",
        )
        sessions = srv["session_memory"]
        table.add_row(
            f"{name} memory (PSS) growth over {sessions['sessions']:,} sessions",
            f"{sessions['pss_growth_after_first_1000_bytes'] / 2**20:+.1f} MiB "
            f"({sessions['pss_growth_after_first_1000_pct']:+.1f}%)",
            "",
            "",
        )
    console.print(table)
    _plot(results, settings.out.with_suffix(".png"))
    console.print(f"wrote {settings.out}")
    return 0


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, srv in results["servers"].items():
        clients = [h["clients"] for h in srv["http"]]
        left.plot(clients, [h["all"]["p50_ms"] for h in srv["http"]], "o-", label=f"{name}: p50")
        left.plot(clients, [h["all"]["p99_ms"] for h in srv["http"]], "s--", label=f"{name}: p99")
    left.axhline(TARGET_P99_SEARCH_MS, color="grey", linestyle=":", label="20 ms target")
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent clients")
    left.set_ylabel("latency (ms)")
    left.set_title(f"HTTP latency, {results['num_products']:,} products")
    left.legend()
    for name, srv in results["servers"].items():
        samples = srv["session_memory"]["pss_samples"]
        right.plot([n for n, _ in samples], [pss / 2**20 for _, pss in samples], "o-", label=name)
    right.legend()
    right.set_xlabel("sessions created and closed")
    right.set_ylabel("server PSS, all processes (MiB)")
    right.set_title("server memory over sessions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "webshop",
        script_path(__file__),
        "Self-hosted WebShop: in-process steps/s and search latency vs the bare index, HTTP servers' "
        "throughput "
        "and latency at 1/8/32 clients, memory per worker and over 10,000 sessions.",
        "python benchmarks/bench_webshop.py",
        ["--num-products", "10000"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
