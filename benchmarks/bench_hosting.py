"""Hosting the envs: ``progpo serve`` against the same envs in process, OpenEnv's protocol against ours, the
fleet and fair sharing (the hour-long soak of a fleet under faults is ``benchmarks/soak.py``).

``python benchmarks/bench_hosting.py hosting [--quick]``; what it measures is its result's section of
``benchmarks/measures.md`` (the results page shows it). Servers run in their own processes on loopback,
clients in this one, playing random admissible actions from fixed seeds (an episode that ends is reset); the
machine is shared, so the claims are ratios of one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import gymnasium as gym
import numpy as np
import requests
from rich.console import Console

import progpo_envs  # noqa: F401
from agents.prompts.webshop import admissible_actions  # an OpenEnv observation's actions, WebShop's too
from benchmarks.common import ServerProcess, free_port, shown
from benchmarks.harness import (
    RESULTS_DIR,
    Benchmark,
    Part,
    PartSettings,
    option,
    recorded_command,
    script_main,
    script_path,
    settings_argv,
)
from benchmarks.lib.hosting import ENVS, available_envs, choose, percentiles, serve_command, start_server
from benchmarks.lib.plots import bars, figure
from benchmarks.lib.processes import cpu_seconds, tree
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.policy import KWARG_BOUNDS
from progpo_envs.server.remote import RemoteEnv, step_batch
from progpo_envs.testing import KEY_DOOR_ENV_ID

console = Console()
SCRIPT = script_path(__file__)
#: The sections of ``hosting.json`` that ``--only`` measures again.
SECTIONS = ["fair_share", "multi_server"]
#: Steps per (env, concurrency) measurement, all clients together.
DEFAULT_STEPS = {"progpo/ALFWorld-v0": 960, "progpo/WebShop-v0": 960}
#: Steps per round of native against OpenEnv (ALFWorld's: 3x the retired bench_openenv.py's 512: its rounds of
#: ~1 s differed by 25% from one to the next, game loads, more than the two doors did).
OPENENV_STEPS = {"progpo/ALFWorld-v0": 1536, "progpo/WebShop-v0": 2560}

# --- clients ---


def play_native(url: str, env_id: str, clients: int, steps_each: int, transport="auto", watch=()) -> dict:
    """``clients`` threads, each stepping its own ``progpo/Remote-v0`` env on ``transport``, released together
    after their resets: ``{latencies, elapsed_s, errors, cpu_s}``, ``cpu_s`` the CPU seconds of this process
    and of each process group of ``watch`` meanwhile."""
    envs = [RemoteEnv(url, env_id, transport=transport) for _ in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        rng, env = random.Random(i), envs[i]
        try:
            info = env.reset(seed=i)[1]
            barrier.wait()
            for _ in range(steps_each):
                t0 = time.perf_counter()
                _, _, terminated, truncated, info = env.step(choose(info["admissible_actions"], rng))
                if terminated or truncated:
                    info = env.reset()[1]
                latencies[i].append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            errors.append(repr(exc))
            if not barrier.broken:
                barrier.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    cpu = lambda: [time.process_time(), *map(cpu_seconds, watch)]  # noqa: E731
    cpu_before, start = cpu(), time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    cpu_s = [now - before for before, now in zip(cpu_before, cpu(), strict=True)]
    for env in envs:
        env.close()
    flat = [x for per_client in latencies for x in per_client]
    return {"latencies": flat, "elapsed_s": elapsed, "errors": errors, "cpu_s": cpu_s}


def play_openenv(url: str, clients: int, steps_each: int) -> dict:
    """``clients`` OpenEnv ``GenericEnvClient`` sessions on one event loop, session ``i`` reset with seed
    ``i`` and acting from ``random.Random(i)``: ``{latencies, elapsed_s, errors}``."""
    from openenv import GenericEnvClient

    async def run() -> dict:
        sessions = [GenericEnvClient(base_url=url, message_timeout_s=600) for _ in range(clients)]
        firsts = await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
        latencies: list[list[float]] = [[] for _ in range(clients)]
        errors: list[str] = []

        async def client(i: int) -> None:
            rng, session, observation = random.Random(i), sessions[i], firsts[i].observation
            try:
                for _ in range(steps_each):
                    t0 = time.perf_counter()
                    result = await session.step({"command": choose(admissible_actions(observation), rng)})
                    observation = result.observation
                    if result.done:
                        observation = (await session.reset()).observation
                    latencies[i].append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - reported in the results
                errors.append(repr(exc))

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(s.close() for s in sessions))
        return {"latencies": [x for per in latencies for x in per], "elapsed_s": elapsed, "errors": errors}

    return asyncio.run(run())


def summary(latencies: list[float], elapsed_s: float, errors: list[str]) -> dict:
    """Steps/s, latency percentiles and errors of one :func:`play_native` / :func:`play_openenv` run."""
    steps = len(latencies)
    return {"steps": steps, "steps_per_s": steps / elapsed_s, "errors": errors, **percentiles(latencies)}


def native_vs_openenv(native: str, openenv: str, env_id: str, clients: int, steps: int, rounds: int) -> dict:
    """``clients`` native sessions against as many OpenEnv sessions: a warm-up round each (not counted: the
    env workers load their games and catalogs), then ``rounds`` rounds, the order swapped every round so that
    a drift in the machine's load falls on both; each protocol's rounds pooled (steps/s over the total time,
    percentiles of every step call)."""
    steps_each = max(4, steps // clients)
    runs: dict[str, list[dict]] = {"native": [], "openenv": []}
    for index in range(-1, rounds):  # round -1: the warm-up
        for protocol in ("native", "openenv") if index % 2 == 0 else ("openenv", "native"):
            if protocol == "native":
                run = play_native(native, env_id, clients, steps_each)
            else:
                run = play_openenv(openenv, clients, steps_each)
            if index >= 0:
                runs[protocol].append(run)
    pooled = {}
    for protocol, played in runs.items():
        elapsed = sum(run["elapsed_s"] for run in played)
        latencies = [x for run in played for x in run["latencies"]]
        pooled[protocol] = summary(latencies, elapsed, [e for run in played for e in run["errors"]])
        by_round = [len(run["latencies"]) / run["elapsed_s"] for run in played]
        pooled[protocol].update(elapsed_s=elapsed, steps_per_s_by_round=by_round)
    return {**pooled, "clients": clients, "rounds": rounds}


# --- hosting: the server against in process, each door, batch stepping, memory ---


def bench_in_process(env_id: str, copies: int, steps_each: int) -> dict:
    """``copies`` envs stepped round-robin in this process."""
    envs = [gym.make(env_id, **ENVS[env_id]) for _ in range(copies)]
    rngs = [random.Random(i) for i in range(copies)]
    infos = [env.reset(seed=i)[1] for i, env in enumerate(envs)]
    latencies = []
    cpu_start, start = time.process_time(), time.perf_counter()
    for _ in range(steps_each):
        for i, env in enumerate(envs):
            t0 = time.perf_counter()
            _, _, terminated, truncated, infos[i] = env.step(choose(infos[i]["admissible_actions"], rngs[i]))
            if terminated or truncated:
                infos[i] = env.reset()[1]
            latencies.append(time.perf_counter() - t0)
    result = summary(latencies, time.perf_counter() - start, [])
    result["cpu_ms_per_step"] = 1000 * (time.process_time() - cpu_start) / len(latencies)
    for env in envs:
        env.close()
    return result


def bench_remote(server: ServerProcess, env_id: str, clients: int, steps_each: int, transport="auto") -> dict:
    """:func:`play_native` against ``server``, with the CPU per step of client, server and env workers."""
    main, *workers = tree(server.pid)  # the server's own process, then its env workers and forkserver
    run = play_native(server.url, env_id, clients, steps_each, transport, watch=([main], workers))
    client, main_cpu, workers_cpu = (1000 * x / max(1, len(run["latencies"])) for x in run["cpu_s"])
    cpu = {"client": client, "server": main_cpu, "env_workers": workers_cpu}
    measured = summary(run["latencies"], run["elapsed_s"], run["errors"])
    return {"transport": transport, **measured, "cpu_ms_per_step": cpu}


def bench_batch(url: str, env_id: str, size: int, rounds: int) -> dict:
    """One batch request for ``size`` instances against ``size`` single-step requests, alternating."""
    envs = [RemoteEnv(url, env_id) for _ in range(size)]
    rng = random.Random(0)
    infos = [env.reset(seed=i)[1] for i, env in enumerate(envs)]
    times: dict[bool, list[float]] = {False: [], True: []}
    for index in range(2 * rounds):
        actions = [choose(info["admissible_actions"], rng) for info in infos]
        t0, batched = time.perf_counter(), bool(index % 2)
        results = step_batch(envs, actions) if batched else list(map(RemoteEnv.step, envs, actions))
        times[batched].append(time.perf_counter() - t0)
        infos = [envs[i].reset()[1] if r[2] or r[3] else r[4] for i, r in enumerate(results)]
    for env in envs:
        env.close()
    single, batch = float(np.median(times[False])), float(np.median(times[True]))
    measured = {"instances": size, "single_requests_s": single, "one_batch_request_s": batch}
    return {**measured, "speedup": single / batch, "batch_steps_per_s": size / batch}


def bench_memory(url: str, env_id: str, count: int) -> dict:
    """Env workers' RSS growth per live (reset) instance, after 4 warm instances."""
    metrics = lambda: requests.get(f"{url}/metrics", timeout=30).json()  # noqa: E731
    workers_rss = lambda: sum(w["rss_bytes"] for w in metrics()["workers"])  # noqa: E731
    warm = [RemoteEnv(url, env_id) for _ in range(4)]
    for i, env in enumerate(warm):
        env.reset(seed=i)
    before = workers_rss()
    envs = [RemoteEnv(url, env_id) for _ in range(count)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    grown = (workers_rss() - before) / count
    for env in envs + warm:
        env.close()
    return {"instances": count, "bytes_per_instance": grown, "mib_per_instance": grown / 2**20}


def measure_env(env_id: str, s: HostingSettings) -> dict:
    """One env's measurements, its servers started and stopped here."""
    console.print(f"[bold]{env_id}[/]: the server ({s.workers} env workers) against in process")
    per_env: dict = {"load_average_before": list(os.getloadavg()), "concurrency": {}}
    with start_server(env_id, s.workers) as server:
        for clients in s.clients:
            steps_each = max(4, (s.steps or DEFAULT_STEPS[env_id]) // clients)
            local = bench_in_process(env_id, clients, steps_each)
            remote = bench_remote(server, env_id, clients, steps_each)
            row = {"in_process": local, "server": remote}
            row.update(throughput_ratio=remote["steps_per_s"] / local["steps_per_s"])
            row.update(p50_ratio=remote["p50_ms"] / local["p50_ms"])
            if clients == 1:  # the HTTP routes beside the stream door, in the same run
                http = row["server_http"] = bench_remote(server, env_id, 1, steps_each, "http")
                per_env["overhead_p50_ms"] = remote["p50_ms"] - local["p50_ms"]
                per_env["overhead_p50_ms_http"] = http["p50_ms"] - local["p50_ms"]
                cpu = {"stream": remote["cpu_ms_per_step"], "http": http["cpu_ms_per_step"]}
                per_env["cpu_ms_per_step_1_client"] = {"in_process": local["cpu_ms_per_step"], **cpu}
            per_env["concurrency"][str(clients)] = row
            console.print(
                f"  {clients:>2} clients: server {remote['steps_per_s']:.0f} steps/s, p50 "
                f"{remote['p50_ms']:.2f} ms; in process {local['steps_per_s']:.0f} steps/s, p50 "
                f"{local['p50_ms']:.2f} ms"
            )
        batch = per_env["batch"] = bench_batch(server.url, env_id, 32, s.batch_rounds)
        if "32" in per_env["concurrency"]:
            in_process = per_env["concurrency"]["32"]["in_process"]["steps_per_s"]
            batch["vs_in_process_32"] = batch["batch_steps_per_s"] / in_process
        per_env["memory"] = bench_memory(server.url, env_id, s.instances)
        if s.openenv_rounds:
            clients, steps = s.openenv_clients, s.openenv_steps or OPENENV_STEPS[env_id]
            console.print(f"  {clients} native against {clients} OpenEnv sessions")
            with start_server(env_id, s.workers, "openenv") as openenv:
                both = native_vs_openenv(server.url, openenv.url, env_id, clients, steps, s.openenv_rounds)
            per_env[f"openenv_{clients}"] = both
            ratio = both["native"]["steps_per_s"] / both["openenv"]["steps_per_s"]
            per_env[f"native_vs_openenv_{clients}"] = ratio
        metrics = requests.get(f"{server.url}/metrics", timeout=30).json()
        per_env["server_metrics"] = {k: v for k, v in metrics.items() if k != "workers"}
    per_env["load_average_after"] = list(os.getloadavg())
    return per_env


# --- fair sharing: a polite client beside a greedy one ---

#: Every loopback address is one client, so the two clients of the measurement are told apart by tokens.
POLITE_TOKEN, GREEDY_TOKEN = "polite-client-token", "greedy-client-token"


def client_session(token: str) -> requests.Session:
    """A session that counts as the client of ``token`` on a server started with the fair-share tokens."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=64))
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def polite_steps(url: str, steps: int) -> list[float]:
    """Latencies of ``steps`` single steps of one toy instance made by the polite client."""
    session = client_session(POLITE_TOKEN)
    created = session.post(f"{url}/instances", json={"env_id": KEY_DOOR_ENV_ID, "seed": 0}, timeout=60)
    created.raise_for_status()
    instance = f"{url}/instances/{created.json()['instance_id']}"
    latencies = []
    for _ in range(steps):
        t0 = time.perf_counter()
        answer = session.post(f"{instance}/step", json={"action": "look"}, timeout=300)
        answer.raise_for_status()
        latencies.append(time.perf_counter() - t0)
        if answer.json()["truncated"]:
            session.post(f"{instance}/reset", json={}, timeout=300).raise_for_status()
    session.delete(instance, timeout=60)
    return latencies


def bench_fair_share(steps: int, greedy_threads: int, workers: int, max_instances: int = 64) -> dict:
    """The polite client's step latency alone and beside the greedy client, on the toy env."""
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".tokens") as tokens:
        tokens.write(f"{POLITE_TOKEN}\n{GREEDY_TOKEN}\n")
        tokens.flush()
        extra = ("--import", "progpo_envs.testing", "--client-tokens", tokens.name)
        command = serve_command(KEY_DOOR_ENV_ID, workers, port, max_instances=max_instances, extra=extra)
        with ServerProcess(command, port, ready_path="/ready") as server:
            alone = polite_steps(server.url, steps)
            greedy = client_session(GREEDY_TOKEN)
            _, high = KWARG_BOUNDS["history_depths"]  # the deepest history windows a client may ask for
            costly = {"history_depths": {"$tuple": list(range(high - 7, high + 1))}, "max_steps": 1000}
            held, refused = [], 0
            for _ in range(max_instances):  # as many as it may hold
                body = {"env_id": KEY_DOOR_ENV_ID, "kwargs": costly, "seed": 0}
                answer = greedy.post(f"{server.url}/instances", json=body, timeout=120)
                if answer.status_code == 429:
                    refused += 1
                    continue
                answer.raise_for_status()
                held.append(answer.json()["instance_id"])
            stop, greedy_steps = threading.Event(), [0] * greedy_threads
            batch = [{"instance_id": held[i % len(held)], "action": "look"} for i in range(4096)]

            def hog(index: int) -> None:
                while not stop.is_set():
                    answer = greedy.post(f"{server.url}/batch/step", json={"steps": batch}, timeout=600)
                    results = answer.json()["results"]
                    greedy_steps[index] += sum(r["ok"] for r in results)
                    answered = zip(batch, results, strict=True)
                    ended = {step["instance_id"] for step, r in answered if r.get("truncated")}
                    if ended:  # keep its episodes going, so every step stays costly
                        resets = [{"instance_id": instance, "seed": 0} for instance in sorted(ended)]
                        greedy.post(f"{server.url}/batch/reset", json={"resets": resets}, timeout=600)

            hogs = [threading.Thread(target=hog, args=(i,), daemon=True) for i in range(greedy_threads)]
            for thread in hogs:
                thread.start()
            time.sleep(1.0)  # the greedy batches are running
            started = time.perf_counter()
            beside = polite_steps(server.url, steps)
            elapsed = time.perf_counter() - started
            stop.set()
            for thread in hogs:
                thread.join(600)
            metrics = requests.get(f"{server.url}/metrics", timeout=60).json()
    alone_ms, beside_ms = percentiles(alone), percentiles(beside)
    greedy_record = {"instances_held": len(held), "creates_refused_429": refused, "threads": greedy_threads}
    greedy_record.update(batch_size=len(batch), steps_done_during_polite_run=sum(greedy_steps))
    served = {"workers": workers, "max_instances": max_instances}
    return {
        "polite_alone": alone_ms,
        "polite_with_greedy": beside_ms,
        "p99_ratio": beside_ms["p99_ms"] / alone_ms["p99_ms"],
        "greedy": {**greedy_record, "polite_run_s": elapsed},
        "server": {**served, "worker_restarts": metrics["worker_restarts"], "lost": metrics["lost"]},
    }


# --- many servers, one env ---

#: Fail fast on a dead server: one retry after 50 ms instead of three over ~1.4 s.
FAST_FAILOVER = {"retries": 1, "backoff": 0.05, "connect_timeout": 2.0}


def group_envs(urls: list[str], env_id: str, groups: int, group_size: int, **kw) -> gym.vector.VectorEnv:
    """``groups × group_size`` copies of ``env_id`` through ``progpo/Remote-v0`` on ``urls``."""
    copies, url = groups * group_size, ",".join(urls)
    return gym.make_vec(REMOTE_ENV_ID, num_envs=copies, group_size=group_size, url=url, env_id=env_id, **kw)


def play_rollouts(envs, seed: int, rng: random.Random, vector_steps: int | None = None, kill=None, stride=0):
    """Lock-step rollouts of every group from ``reset_copies(seed)``: one to its end, or, with
    ``vector_steps``, as many as that many vector steps take (the copies reset together, with seed ``seed +
    resets * stride``, when all their episodes ended); ``kill(step)`` is called before each vector step.
    Episodes that finished, those a lost server ended (``info["env_error"]``), copy steps of episodes in
    flight, resets, and the vector steps' latencies."""
    _, infos = envs.reset_copies(seed=seed)
    done = [False] * envs.num_envs
    record = {"episodes": envs.num_envs, "finished": 0, "failed": 0, "steps": 0, "resets": 1, "latencies": []}
    for step in range(vector_steps or 10_000):
        if all(done):
            if vector_steps is None:
                break
            _, infos = envs.reset_copies(seed=seed + record["resets"] * stride)
            done, record["resets"] = [False] * envs.num_envs, record["resets"] + 1
        if kill is not None:
            kill(step)
        live = zip(done, infos, strict=True)
        actions = ["" if d else choose(info["admissible_actions"], rng) for d, info in live]
        t0 = time.perf_counter()
        _, _, terminated, truncated, infos = envs.step_copies(actions)
        record["latencies"].append(time.perf_counter() - t0)
        record["steps"] += done.count(False)
        for i, info in enumerate(infos):
            if not done[i] and (terminated[i] or truncated[i]):
                done[i] = True
                record["failed" if "env_error" in info else "finished"] += 1
    return record


def bench_servers(urls: list[str], env_id: str, groups: int, group_size: int, vector_steps: int) -> dict:
    """Steps/s of one group vector env over ``urls``, resets included."""
    envs = group_envs(urls, env_id, groups, group_size)
    try:
        started = time.perf_counter()
        played = play_rollouts(envs, 0, random.Random(0), vector_steps, stride=groups)
        elapsed = time.perf_counter() - started
        shares = [s["groups"] for s in envs.servers()] if len(urls) > 1 else [groups]
    finally:
        envs.close()
    latency = percentiles(played["latencies"])
    return {
        "servers": len(urls),
        "copies": groups * group_size,
        "vector_steps": vector_steps,
        "resets": played["resets"],
        "steps": played["steps"],
        "steps_per_s": played["steps"] / elapsed,
        "vector_step_p50_ms": latency["p50_ms"],
        "vector_step_p99_ms": latency["p99_ms"],
        "groups_per_server": shares,
    }


def bench_kill(servers: list[ServerProcess], env_id: str, groups: int, group_size: int, kill_after: int):
    """The last of ``servers`` killed (SIGKILL) after ``kill_after`` vector steps of a rollout, then the next
    rollout on the servers left."""
    envs = group_envs([s.url for s in servers], env_id, groups, group_size, max_steps=10, **FAST_FAILOVER)
    rng, victim = random.Random(1), servers[-1]

    def kill(step: int) -> None:
        if step == kill_after:
            victim.process.kill()
            victim.process.wait(30)

    try:
        before = [s["groups"] for s in envs.servers()]
        started = time.perf_counter()
        with_kill = play_rollouts(envs, 0, rng, kill=kill)
        with_kill["seconds"] = time.perf_counter() - started
        next_rollout = play_rollouts(envs, groups, rng)
        status = envs.servers()
    finally:
        envs.close()
    keep = ("episodes", "finished", "failed")
    return {
        "env": env_id,
        "servers": len(servers),
        "groups": groups,
        "group_size": group_size,
        "killed_server": len(servers) - 1,
        "killed_after_vector_steps": kill_after,
        "groups_per_server_before": before,
        "rollout_with_kill": {k: with_kill[k] for k in (*keep, "seconds")},
        "next_rollout": {k: next_rollout[k] for k in keep},
        "groups_recreated": sum(s["lost_groups"] for s in status),
        "groups_per_server_after": [s["groups"] for s in status],
        "server_status": status,
    }


def bench_multi_server(s: HostingSettings) -> dict:
    """1 against 3 servers per env, and the kill test (on WebShop when it is available)."""
    throughput, kill = {}, None
    env_ids = available_envs(s.envs or list(ENVS), console)
    groups, size = s.multi_server_groups, s.multi_server_group_size
    for env_id in env_ids:
        console.print(f"[bold]{env_id}[/]: 1 against 3 servers ({s.workers} env workers each)")
        servers: list[ServerProcess] = []
        try:
            servers = [start_server(env_id, s.workers) for _ in range(3)]
            urls = [server.url for server in servers]
            one = bench_servers(urls[:1], env_id, groups, size, s.multi_server_steps)
            three = bench_servers(urls, env_id, groups, size, s.multi_server_steps)
            throughput[env_id] = {"1": one, "3": three, "speedup": three["steps_per_s"] / one["steps_per_s"]}
            if kill is None and env_id in ("progpo/WebShop-v0", env_ids[-1]):
                kill = bench_kill(servers, env_id, groups, size, s.multi_server_kill_after)
        finally:
            for server in servers:
                server.stop()
    return {"throughput": throughput, "kill": kill}


@dataclass
class HostingSettings(PartSettings):
    clients: list[int] = option([1, 8, 32], "concurrent clients per measurement")
    steps: int | None = option(None, "steps per (env, concurrency) measurement (default: per env)")
    workers: int = option(2, "env worker processes of each server")
    instances: int = option(100, "live instances for the memory measurement")
    batch_rounds: int = option(8, "rounds of batch stepping")
    envs: list[str] | None = option(None, "only these env ids", flag="--env", action="append")
    only: str | None = option(
        None, "measure only this section and keep the others of the result file", choices=SECTIONS
    )
    multi_server_groups: int = option(6, "multi_server: task groups of the vector env")
    multi_server_group_size: int = option(4, "multi_server: copies per group")
    multi_server_steps: int = option(200, "multi_server: vector steps per 1- and 3-server measurement")
    multi_server_kill_after: int = option(3, "multi_server: vector steps of the rollout before the kill")
    fair_share_steps: int = option(300, "polite client steps per run")
    greedy_threads: int = option(4, "greedy client's concurrent batches")
    openenv_clients: int = option(32, "native against OpenEnv: concurrent sessions per protocol")
    openenv_steps: int | None = option(None, "native against OpenEnv: steps per round (default: per env)")
    openenv_rounds: int = option(3, "native against OpenEnv: rounds per protocol after a warm-up (0: skip)")
    quick: bool = option(False, "a smoke run: few steps and clients")

    def __post_init__(self):
        if self.quick:
            quick = dict(steps=64, instances=8, batch_rounds=2, clients=[1, 8], fair_share_steps=60)
            quick.update(greedy_threads=2, multi_server_steps=30, openenv_clients=8, openenv_steps=64)
            for key, value in {**quick, "openenv_rounds": 1}.items():
                setattr(self, key, value)


def run_hosting(s: HostingSettings) -> dict:
    """The env server against in process, each door, OpenEnv, batch stepping, memory, fleet, fair sharing."""

    def section(name: str, measured: dict, **settings) -> dict:  # with the command that measures it again
        command = recorded_command(SCRIPT, ["hosting", *settings_argv(s, only=name)])
        load = {"load_average": list(os.getloadavg())}
        return {"command": command, "notes": SECTION_NOTES[name], "machine": load, **settings, **measured}

    result: dict = {}
    if s.only in (None, "fair_share"):
        console.print("[bold]fair share[/]: a polite client alone and beside a greedy one")
        measured = bench_fair_share(s.fair_share_steps, s.greedy_threads, s.workers)
        result["fair_share"] = section("fair_share", measured)
    if s.only is None:
        env_ids = available_envs(s.envs or list(ENVS), console)
        result["results"] = {env_id: measure_env(env_id, s) for env_id in env_ids}
    if s.only in (None, "multi_server"):
        settings = {"groups": s.multi_server_groups, "group_size": s.multi_server_group_size}
        settings.update(vector_steps=s.multi_server_steps, workers_per_server=s.workers, env_kwargs=ENVS)
        result["multi_server"] = section("multi_server", bench_multi_server(s), settings=settings)
    if s.only:  # the other sections stay as the result file has them
        path = Path(s.out or RESULTS_DIR / "hosting.json")
        console.print(f"updating the {s.only} section of {shown(path)}")
        return {**json.loads(path.read_text()), **result}
    openenv = {"clients": s.openenv_clients, "steps_per_round": s.openenv_steps or OPENENV_STEPS}
    settings = {"clients": s.clients, "steps": s.steps or DEFAULT_STEPS, "workers": s.workers}
    settings.update(instances=s.instances, openenv={**openenv, "rounds": s.openenv_rounds}, env_kwargs=ENVS)
    return {"settings": settings, "notes": SECTION_NOTES["hosting"], **result}


#: How each section was measured, recorded in the result beside its numbers.
SECTION_NOTES = {
    "hosting": "Server: `progpo serve` in its own process (waitress, --workers env workers); clients: "
    "progpo/Remote-v0 on the stream door (`server_http`: the HTTP routes), a thread each, in this process; "
    "baseline: as many copies stepped round-robin in process. overhead_p50_ms = server p50 - in-process p50 "
    "at 1 client; openenv_32: 32 native against 32 OpenEnv sessions on the same env workers, alternating "
    "rounds pooled; batch.vs_in_process_32 = steps/s of one /batch/step for 32 instances / in-process "
    "steps/s of 32 copies. The machine is shared (load averages per env and for the run).",
    "fair_share": "The toy env (progpo/ServerToy-v0), --max-instances 64, --client-tokens (two clients of "
    "one host). Polite: one instance, sequential single steps. Greedy: every instance it may hold (half), "
    "each with the deepest history windows, stepped by concurrent 4,096-step batches. p99_ratio = polite p99 "
    "beside the greedy client / alone, in the same run.",
    "multi_server": "Three `progpo serve` processes; one group vector env of progpo/Remote-v0, random "
    "admissible actions in lock step, resets in the time. '1': the first server only; '3': all three (groups "
    "spread by load, one batch request per server per vector step, in parallel). Kill test: SIGKILL to the "
    "third server mid-rollout (max_steps 10, one retry after 50 ms); `failed`: episodes ended with "
    "info['env_error']; `groups_recreated`: groups made again on the servers left. The servers share the "
    "machine's cores.",
}


def plot_hosting(result: dict, path: Path) -> None:
    """Per env, the p50 step latency at 1 client (in process, each door) and the steps/s with 32 clients."""
    results = result["results"]
    names = [env_id.split("/")[-1] for env_id in results]
    one = [r["concurrency"].get("1", {}) for r in results.values()]
    many = [r["concurrency"].get("32", {}) for r in results.values()]
    doors = {"in process": "in_process", "stream door": "server", "HTTP routes": "server_http"}
    with figure(path, panels=2, width=5, title="progpo serve vs in process (one run, same machine)") as axes:
        latency = {label: [c.get(key, {}).get("p50_ms") for c in one] for label, key in doors.items()}
        bars(axes[0], names, latency, log=True, ylabel="p50 step latency at 1 client (ms)")
        throughput = {"in process": [c.get("in_process", {}).get("steps_per_s") for c in many]}
        for protocol in ("native", "openenv"):
            compared = [r.get("openenv_32", {}).get(protocol, {}) for r in results.values()]
            throughput[protocol] = [c.get("steps_per_s") for c in compared]
        bars(axes[1], names, throughput, log=True, ylabel="steps/s, 32 clients")


PARTS = {"hosting": Part(HostingSettings, run_hosting, plot_hosting)}
SPECS = (Benchmark("hosting", ["hosting"]),)


main = script_main(__name__, __file__, PARTS, SPECS, __doc__)
