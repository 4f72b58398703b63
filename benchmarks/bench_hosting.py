"""Cost of hosting the envs: the env server against the same envs in-process.

Measured for each env (ALFWorld on generated games, WebShop on a generated catalog), at 1, 8 and 32 concurrent
clients:

* steps/s and p50/p99 step latency through the server (``progpo/Remote-v0`` clients, one thread each, on its
  default transport, the stream door, against ``progpo serve`` in its own process with ``--workers`` env
  workers), and the same for the in-process env (the baseline: the same number of env copies stepped
  round-robin in one process, as a sync group vector env does); the ratio server/in-process;
* at 1 client, the same again over the HTTP routes (``transport="http"``), the overhead of each door
  (``overhead_p50_ms``: server p50 minus in-process p50) and where the time goes: CPU per step of the client
  (this process), the server's own process and its env workers;
* native vs OpenEnv (``openenv_32``): 32 native sessions against 32 OpenEnv sessions (``progpo serve
  --protocol openenv``, the same env workers, OpenEnv's ``GenericEnvClient``), as ``bench_openenv.py`` plays
  them, in this run; ``native_vs_openenv_32`` = native steps/s / OpenEnv steps/s;
* batch stepping: one ``/batch/step`` request for 32 instances against 32 single-step requests (speed-up), and
  its steps/s against 32 copies in process (``vs_in_process_32``);
* memory per live instance: growth of the env workers' resident memory over ``--instances`` reset instances;
* many servers (``multi_server``): one group vector env (``--multi-server-groups`` groups of
  ``--multi-server-group-size`` copies, random admissible actions, lock step) through ``progpo/Remote-v0`` on
  one server and on three (each ``--workers`` env workers, the groups spread over them, one batch request per
  server in parallel): steps/s of the copies in flight, resets included; then the kill test: three servers,
  the third killed (SIGKILL) after ``--multi-server-kill-after`` vector steps of a rollout, the rollout played
  to its end and the next one played on the two left: groups, episodes finished and failed in each, groups
  made again;
* fair sharing (``fair_share``): a polite client (one instance, one step at a time) alone, and beside a greedy
  client (another client token: as many instances as the server lets it hold, each step made
  costly by the deepest history windows a client may ask for, stepped in ``/batch/step`` requests of 4,096
  steps by several threads at once); the claim is the polite client's p99 step latency with the greedy client
  over its p99 alone, in the same run (on the toy env, so the env's own cost does not hide the scheduling).

Actions are drawn from the env's admissible actions (WebShop: its search/click actions) with a fixed seed; an
episode that ends is reset. Loopback only. The machine is shared (load average recorded), so absolute numbers
vary between runs; the ratios against the in-process baseline of the same run are the claim.

Run: ``.venv/bin/python benchmarks/bench_hosting.py`` (about 5-10 minutes; ``--quick`` for a smoke run;
``--only fair_share`` or ``--only multi_server`` runs that case alone and updates only its section). Writes
``benchmarks/results/hosting.json`` (the machine's load average before and after, for the run and per env)
and ``benchmarks/results/hosting.png``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load)

# isort: split

import gymnasium as gym
import numpy as np
import psutil
import requests
from rich.console import Console
from rich.table import Table

import progpo_envs  # noqa: F401
from benchmarks.common import RESULTS_DIR, ServerProcess, free_port, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, script_path
from benchmarks.lib.hosting import (
    ENVS,
    available_envs,
    choose,
    percentiles,
    pooled,
    run_openenv_async,
    start_server,
)
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.policy import KWARG_BOUNDS
from progpo_envs.server.remote import RemoteEnv, step_batch
from progpo_envs.testing import KEY_DOOR_ENV_ID

ROOT = Path(__file__).resolve().parents[1]
#: Steps per (env, concurrency) measurement (ALFWorld steps are ~10x slower than WebShop's, game loads more).
DEFAULT_STEPS = {"progpo/ALFWorld-v0": 960, "progpo/WebShop-v0": 960}
#: Steps per round of the native-vs-OpenEnv comparison (all clients together). ALFWorld's rounds are 3x
#: bench_openenv.py's 512: its rounds of ~1 s differed by 25% from one to the next (game loads), more than
#: the two doors did.
OPENENV_STEPS = {"progpo/ALFWorld-v0": 1536, "progpo/WebShop-v0": 2560}
RESULT = RESULTS_DIR / "hosting.json"
PLOT = RESULTS_DIR / "hosting.png"


def choose_action(info: dict, rng: random.Random) -> str:
    """A random admissible action (a concrete query for WebShop's search placeholder)."""
    return choose(info["admissible_actions"], rng)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``processes`` so far (those that ended count 0)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def server_processes(server: ServerProcess) -> tuple[psutil.Process, list[psutil.Process]]:
    """A server's own process and its env workers (its children: the workers, the forkserver)."""
    main = psutil.Process(server.pid)
    return main, main.children(recursive=True)


def bench_in_process(env_id: str, copies: int, steps_per_copy: int) -> dict:
    """``copies`` envs stepped round-robin in this process."""
    envs = [gym.make(env_id, **ENVS[env_id]) for _ in range(copies)]
    rngs = [random.Random(i) for i in range(copies)]
    infos = [env.reset(seed=i)[1] for i, env in enumerate(envs)]
    latencies = []
    cpu_start = time.process_time()
    start = time.perf_counter()
    for _ in range(steps_per_copy):
        for i, env in enumerate(envs):
            t0 = time.perf_counter()
            _, _, terminated, truncated, infos[i] = env.step(choose_action(infos[i], rngs[i]))
            if terminated or truncated:
                infos[i] = env.reset()[1]
            latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    for env in envs:
        env.close()
    return {
        "steps": len(latencies),
        "steps_per_s": len(latencies) / elapsed,
        **percentiles(latencies),
        "cpu_ms_per_step": 1000 * cpu / len(latencies),
    }


def play_remote(
    url: str, env_id: str, clients: int, steps_per_client: int, transport: str, server: ServerProcess | None
) -> dict:
    """``clients`` threads, each stepping its own remote env (``transport``: ``progpo/Remote-v0``'s);
    ``{latencies, elapsed_s, errors}`` and the CPU each side spent (this process, the server's own process,
    its env workers)."""
    envs = [RemoteEnv(url, env_id, transport=transport) for _ in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        rng, env = random.Random(i), envs[i]
        try:
            info = env.reset(seed=i)[1]
            barrier.wait()
            for _ in range(steps_per_client):
                t0 = time.perf_counter()
                _, _, terminated, truncated, info = env.step(choose_action(info, rng))
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
    main, workers = server_processes(server) if server is not None else (None, [])
    cpu_before = (time.process_time(), cpu_seconds([main] if main else []), cpu_seconds(workers))
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    cpu_after = (time.process_time(), cpu_seconds([main] if main else []), cpu_seconds(workers))
    for env in envs:
        env.close()
    flat = [x for per_client in latencies for x in per_client]
    cpu = [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]
    return {"latencies": flat, "elapsed_s": elapsed, "errors": errors, "cpu_s": cpu}


def bench_remote(
    url: str,
    env_id: str,
    clients: int,
    steps_per_client: int,
    transport: str = "auto",
    server: ServerProcess | None = None,
) -> dict:
    """Steps/s, latency percentiles and CPU per step (client, server, env workers) of :func:`play_remote`."""
    run = play_remote(url, env_id, clients, steps_per_client, transport, server)
    steps = max(1, len(run["latencies"]))
    client, main, workers = (1000 * x / steps for x in run["cpu_s"])
    return {
        "transport": transport,
        "steps": len(run["latencies"]),
        "steps_per_s": len(run["latencies"]) / run["elapsed_s"],
        "errors": run["errors"],
        **percentiles(run["latencies"] or [0.0]),
        "cpu_ms_per_step": {"client": client, "server": main, "env_workers": workers},
    }


def bench_vs_openenv(
    native: ServerProcess, openenv: ServerProcess, env_id: str, clients: int, steps: int, rounds: int
) -> dict:
    """``clients`` native sessions (``progpo/Remote-v0`` threads, its default transport) against as many
    OpenEnv sessions (OpenEnv's ``GenericEnvClient`` on one event loop), both servers with the same env
    workers: a warm-up round each, then ``rounds`` rounds in alternating order, pooled (as
    ``bench_openenv.py`` measures them)."""
    steps_each = max(4, steps // clients)
    runs: dict[str, list[dict]] = {"native": [], "openenv": []}
    for round_index in range(-1, rounds):  # round -1: the warm-up
        order = ("native", "openenv") if round_index % 2 == 0 else ("openenv", "native")
        for protocol in order:
            if protocol == "native":
                run = play_remote(native.url, env_id, clients, steps_each, "auto", None)
            else:
                run = run_openenv_async(openenv.url, clients, steps_each)
            if round_index >= 0:
                runs[protocol].append(run)
    result = {protocol: pooled(protocol_runs) for protocol, protocol_runs in runs.items()}
    for row in result.values():
        row.pop("latencies", None)
    result["clients"] = clients
    result["rounds"] = rounds
    return result


def bench_batch(url: str, env_id: str, size: int, rounds: int) -> dict:
    """One batch request for ``size`` instances vs ``size`` single-step requests (same envs, same actions)."""
    envs = [RemoteEnv(url, env_id) for _ in range(size)]
    rng = random.Random(0)
    infos = [env.reset(seed=i)[1] for i, env in enumerate(envs)]
    single, batched = [], []
    for round_index in range(2 * rounds):
        actions = [choose_action(info, rng) for info in infos]
        t0 = time.perf_counter()
        if round_index % 2:
            results = step_batch(envs, actions)
            batched.append(time.perf_counter() - t0)
        else:
            results = [env.step(action) for env, action in zip(envs, actions, strict=True)]
            single.append(time.perf_counter() - t0)
        infos = [r[4] for r in results]
        for i, r in enumerate(results):
            if r[2] or r[3]:
                infos[i] = envs[i].reset()[1]
    for env in envs:
        env.close()
    single_s, batch_s = float(np.median(single)), float(np.median(batched))
    return {
        "instances": size,
        "single_requests_s": single_s,
        "one_batch_request_s": batch_s,
        "speedup": single_s / batch_s,
        "batch_steps_per_s": size / batch_s,
    }


def bench_memory(url: str, env_id: str, count: int) -> dict:
    """Worker RSS growth per live (reset) instance."""

    def worker_rss() -> int:
        return sum(w["rss_bytes"] for w in requests.get(f"{url}/metrics", timeout=30).json()["workers"])

    warm = [RemoteEnv(url, env_id) for _ in range(4)]
    for i, env in enumerate(warm):
        env.reset(seed=i)
    before = worker_rss()
    envs = [RemoteEnv(url, env_id) for _ in range(count)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    after = worker_rss()
    for env in envs + warm:
        env.close()
    return {
        "instances": count,
        "bytes_per_instance": (after - before) / count,
        "mib_per_instance": (after - before) / count / 2**20,
    }


#: The fair-share server's client tokens: every loopback address is one client, so the two clients of the
#: measurement, on one machine, are told apart by the operator's tokens (webshop_server.clients).
POLITE_TOKEN, GREEDY_TOKEN = "polite-client-token", "greedy-client-token"


def client_session(token: str) -> requests.Session:
    """A session that counts as the client of ``token`` on a server started with the fair-share tokens."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=64))
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def polite_steps(url: str, steps: int, stop_early: threading.Event | None = None) -> list[float]:
    """Latencies of ``steps`` single steps of one toy instance made by the polite client."""
    session = client_session(POLITE_TOKEN)
    created = session.post(f"{url}/instances", json={"env_id": KEY_DOOR_ENV_ID, "seed": 0}, timeout=60)
    created.raise_for_status()
    instance = created.json()["instance_id"]
    latencies = []
    for _ in range(steps):
        t0 = time.perf_counter()
        answer = session.post(f"{url}/instances/{instance}/step", json={"action": "look"}, timeout=300)
        answer.raise_for_status()
        latencies.append(time.perf_counter() - t0)
        if answer.json()["truncated"]:
            session.post(f"{url}/instances/{instance}/reset", json={}, timeout=300).raise_for_status()
    session.delete(f"{url}/instances/{instance}", timeout=60)
    return latencies


def bench_fair_share(steps: int, greedy_threads: int, workers: int, max_instances: int) -> dict:
    """The polite client's step latency alone and beside a greedy client (see the module docstring)."""
    port = free_port()
    tokens = tempfile.NamedTemporaryFile("w", suffix=".tokens", delete=False)
    tokens.write(f"{POLITE_TOKEN}\n{GREEDY_TOKEN}\n")
    tokens.close()
    command = [sys.executable, "-m", "progpo_envs.server.cli", "--import", "progpo_envs.testing"]
    command += ["--env", KEY_DOOR_ENV_ID, "--port", str(port), "--workers", str(workers)]
    command += ["--max-instances", str(max_instances), "--agentgym", "none", "--client-tokens", tokens.name]
    server = ServerProcess(command, port, ready_path="/ready")
    low, high = KWARG_BOUNDS["history_depths"]
    costly = {"history_depths": {"$tuple": list(range(high - 7, high + 1))}, "max_steps": 1000}
    try:
        alone = polite_steps(server.url, steps)
        greedy = client_session(GREEDY_TOKEN)
        held, refused = [], 0
        for _ in range(max_instances):  # as many as it may hold
            answer = greedy.post(
                f"{server.url}/instances",
                json={"env_id": KEY_DOOR_ENV_ID, "kwargs": costly, "seed": 0},
                timeout=120,
            )
            if answer.status_code == 429:
                refused += 1
                continue
            answer.raise_for_status()
            held.append(answer.json()["instance_id"])
        stop = threading.Event()
        greedy_steps = [0] * greedy_threads
        batch = [{"instance_id": held[i % len(held)], "action": "look"} for i in range(4096)]

        def hog(index: int) -> None:
            while not stop.is_set():
                answer = greedy.post(f"{server.url}/batch/step", json={"steps": batch}, timeout=600)
                results = answer.json()["results"]
                greedy_steps[index] += sum(r["ok"] for r in results)
                ended = {
                    item["instance_id"] for item, r in zip(batch, results, strict=True) if r.get("truncated")
                }
                resets = [{"instance_id": instance, "seed": 0} for instance in sorted(ended)]
                if resets:  # keep its episodes going, so every step stays costly
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
    finally:
        server.stop()
        os.unlink(tokens.name)
    alone_ms, beside_ms = percentiles(alone), percentiles(beside)
    return {
        "polite_alone": alone_ms,
        "polite_with_greedy": beside_ms,
        "p99_ratio": beside_ms["p99_ms"] / alone_ms["p99_ms"],
        "greedy": {
            "instances_held": len(held),
            "creates_refused_429": refused,
            "threads": greedy_threads,
            "batch_size": len(batch),
            "steps_done_during_polite_run": sum(greedy_steps),
            "polite_run_s": elapsed,
        },
        "server": {
            "workers": workers,
            "max_instances": max_instances,
            "worker_restarts": metrics["worker_restarts"],
            "lost": metrics["lost"],
        },
    }


# ------------------------------------------------------------------------------------------------------------
# Many servers, one env (``multi_server``)
# ------------------------------------------------------------------------------------------------------------

#: Fail fast on a dead server: one retry after 50 ms instead of three over ~1.4 s.
FAST_FAILOVER = {"retries": 1, "backoff": 0.05, "connect_timeout": 2.0}


def group_envs(urls: list[str], env_id: str, groups: int, group_size: int, **kwargs) -> gym.vector.VectorEnv:
    """``groups × group_size`` copies of ``env_id`` through ``progpo/Remote-v0`` on ``urls``."""
    return gym.make_vec(
        REMOTE_ENV_ID,
        num_envs=groups * group_size,
        group_size=group_size,
        url=",".join(urls),
        env_id=env_id,
        **kwargs,
    )


def bench_servers(urls: list[str], env_id: str, groups: int, group_size: int, vector_steps: int) -> dict:
    """Steps/s of one group vector env over ``urls``: random admissible actions in lock step for
    ``vector_steps`` vector steps, the copies reset together when every episode has ended."""
    envs = group_envs(urls, env_id, groups, group_size)
    rng = random.Random(0)
    latencies: list[float] = []
    steps = resets = 0
    try:
        started = time.perf_counter()
        _, infos = envs.reset_copies(seed=0)
        done = [False] * envs.num_envs
        for _ in range(vector_steps):
            if all(done):
                resets += 1
                _, infos = envs.reset_copies(seed=resets * groups)
                done = [False] * envs.num_envs
            actions = ["" if d else choose_action(info, rng) for d, info in zip(done, infos, strict=True)]
            t0 = time.perf_counter()
            _, _, terminated, truncated, infos = envs.step_copies(actions)
            latencies.append(time.perf_counter() - t0)
            steps += done.count(False)
            done = [d or bool(t) or bool(u) for d, t, u in zip(done, terminated, truncated, strict=True)]
        elapsed = time.perf_counter() - started
        shares = [s["groups"] for s in envs.servers()] if len(urls) > 1 else [groups]
    finally:
        envs.close()
    vector = percentiles(latencies)
    return {
        "servers": len(urls),
        "copies": groups * group_size,
        "vector_steps": vector_steps,
        "resets": resets + 1,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "vector_step_p50_ms": vector["p50_ms"],
        "vector_step_p99_ms": vector["p99_ms"],
        "groups_per_server": shares,
    }


def play_rollout(envs, seed: int, rng: random.Random, kill=None) -> dict:
    """One lock-step rollout of every group to its end (``kill(step)`` called before each vector step);
    episodes that finished and those a lost server ended (``info["env_error"]``)."""
    _, infos = envs.reset_copies(seed=seed)
    done = [False] * envs.num_envs
    finished = failed = 0
    for step in range(10_000):
        if all(done):
            break
        if kill is not None:
            kill(step)
        actions = ["" if d else choose_action(info, rng) for d, info in zip(done, infos, strict=True)]
        _, _, terminated, truncated, infos = envs.step_copies(actions)
        for i, info in enumerate(infos):
            if not done[i] and (terminated[i] or truncated[i]):
                done[i] = True
                failed += "env_error" in info
                finished += "env_error" not in info
    return {"episodes": envs.num_envs, "finished": finished, "failed": failed}


def bench_kill(
    servers: list[ServerProcess], env_id: str, groups: int, group_size: int, kill_after: int
) -> dict:
    """The kill test: the last of ``servers`` killed after ``kill_after`` vector steps of a rollout, then the
    next rollout on the servers left."""
    urls = [server.url for server in servers]
    envs = group_envs(urls, env_id, groups, group_size, max_steps=10, **FAST_FAILOVER)
    rng = random.Random(1)
    victim = servers[-1]

    def kill(step: int) -> None:
        if step == kill_after:
            victim.process.kill()
            victim.process.wait(30)

    try:
        before = [s["groups"] for s in envs.servers()]
        started = time.perf_counter()
        with_kill = play_rollout(envs, 0, rng, kill)
        after_kill_s = time.perf_counter() - started
        next_rollout = play_rollout(envs, groups, rng)
        status = envs.servers()
    finally:
        envs.close()
    return {
        "env": env_id,
        "servers": len(servers),
        "groups": groups,
        "group_size": group_size,
        "killed_server": len(servers) - 1,
        "killed_after_vector_steps": kill_after,
        "groups_per_server_before": before,
        "rollout_with_kill": {**with_kill, "seconds": after_kill_s},
        "next_rollout": next_rollout,
        "groups_recreated": sum(s["lost_groups"] for s in status),
        "groups_per_server_after": [s["groups"] for s in status],
        "server_status": status,
    }


def bench_multi_server(settings: Settings, console: Console) -> dict:
    """1 vs 3 servers per env, and the kill test (on WebShop when it is available)."""
    throughput: dict = {}
    env_ids = available_envs(settings.envs or list(ENVS), console)
    groups, size = settings.multi_server_groups, settings.multi_server_group_size
    kill: dict | None = None
    for env_id in env_ids:
        console.print(f"[bold]{env_id}[/]: 1 vs 3 servers ({settings.workers} env workers each)")
        servers: list[ServerProcess] = []
        try:
            servers = [start_server(env_id, settings.workers) for _ in range(3)]
            urls = [server.url for server in servers]
            one = bench_servers(urls[:1], env_id, groups, size, settings.multi_server_steps)
            three = bench_servers(urls, env_id, groups, size, settings.multi_server_steps)
            throughput[env_id] = {"1": one, "3": three, "speedup": three["steps_per_s"] / one["steps_per_s"]}
            console.print(
                f"  1 server {one['steps_per_s']:.0f} steps/s, 3 servers {three['steps_per_s']:.0f} steps/s "
                f"(x{throughput[env_id]['speedup']:.2f}; groups {three['groups_per_server']})"
            )
            if kill is None and (env_id == "progpo/WebShop-v0" or env_id == env_ids[-1]):
                kill = bench_kill(servers, env_id, groups, size, settings.multi_server_kill_after)
                done, later = kill["rollout_with_kill"], kill["next_rollout"]
                console.print(
                    f"  kill test: server {kill['killed_server']} killed after "
                    f"{kill['killed_after_vector_steps']} steps: {done['finished']} episodes finished, "
                    f"{done['failed']} failed; next rollout {later['finished']} finished, {later['failed']} "
                    f"failed; {kill['groups_recreated']} groups made again, groups per server "
                    f"{kill['groups_per_server_before']} -> {kill['groups_per_server_after']}"
                )
        finally:
            for server in servers:
                server.stop()
    return {"throughput": throughput, "kill": kill}


def multi_server_section(result: dict, settings: Settings) -> dict:
    """The ``multi_server`` section of the JSON: the result with how it was measured."""
    return {
        "command": "python benchmarks/bench_hosting.py --only multi_server"
        f" --multi-server-groups {settings.multi_server_groups}"
        f" --multi-server-group-size {settings.multi_server_group_size}"
        f" --multi-server-steps {settings.multi_server_steps}"
        f" --multi-server-kill-after {settings.multi_server_kill_after} --workers {settings.workers}"
        + "".join(f" --env {env_id}" for env_id in settings.envs or []),
        "notes": "Three `progpo serve` processes on loopback (--workers env workers each, the env kwargs of "
        "`settings.env_kwargs`); one group vector env of progpo/Remote-v0 in this process, random admissible "
        "actions in lock step, the copies reset together when all their episodes ended (resets in the time). "
        "'1': url names the first server (the one-server client); '3': all three (groups spread by load, one "
        "batch request per server per vector step, in parallel). steps = copy steps of episodes in flight. "
        "Kill test: SIGKILL to the third server's process mid-rollout (max_steps 10, one retry after 50 ms); "
        "`failed` episodes ended with info['env_error'], `groups_recreated` = groups made again on the "
        "servers left at the next reset. Three servers on one machine share its cores: the speed-up is "
        "bounded by the cores (see machine).",
        "machine": machine_info(processor=platform.processor(), load_average=list(os.getloadavg())),
        "settings": {
            "groups": settings.multi_server_groups,
            "group_size": settings.multi_server_group_size,
            "vector_steps": settings.multi_server_steps,
            "workers_per_server": settings.workers,
            "env_kwargs": ENVS,
        },
        **result,
    }


@dataclass
class Settings:
    clients: list[int] = option([1, 8, 32], "concurrent clients per measurement")
    steps: int | None = option(
        None, "steps per (env, concurrency) measurement (default: per env, DEFAULT_STEPS)"
    )
    workers: int = option(2, "env worker processes of the server")
    instances: int = option(100, "live instances for the memory measurement")
    batch_rounds: int = option(8, "rounds of batch stepping")
    envs: list[str] | None = option(None, "only these env ids", flag="--env", action="append", nargs=None)
    quick: bool = option(False, "a smoke run: few steps, no JSON written")
    only: str | None = option(
        None,
        "run only this case and update only its section of the JSON (the other sections are kept)",
        choices=["fair_share", "multi_server"],
    )
    multi_server_groups: int = option(6, "multi_server: task groups of the vector env")
    multi_server_group_size: int = option(4, "multi_server: copies per group")
    multi_server_steps: int = option(200, "multi_server: vector steps per 1- and 3-server measurement")
    multi_server_kill_after: int = option(3, "multi_server: vector steps of the rollout before the kill")
    fair_share_steps: int = option(300, "polite client steps per run")
    greedy_threads: int = option(4, "greedy client's concurrent batches")
    openenv_clients: int = option(32, "native vs OpenEnv: concurrent sessions per protocol")
    openenv_steps: int | None = option(
        None, "native vs OpenEnv: steps per round, all sessions (default: per env, OPENENV_STEPS)"
    )
    openenv_rounds: int = option(3, "native vs OpenEnv: rounds per protocol after a warm-up (0: skip)")


def measure_env(env_id: str, settings: Settings, console: Console) -> dict:
    """One env's hosting measurements (the module docstring), its server started and stopped here."""
    console.print(f"[bold]{env_id}[/]: starting the servers ({settings.workers} env workers each)")
    per_env: dict = {"load_average_before": list(os.getloadavg()), "concurrency": {}}
    server = start_server(env_id, settings.workers)
    try:
        for clients in settings.clients:
            steps_each = max(4, (settings.steps or DEFAULT_STEPS[env_id]) // clients)
            local = bench_in_process(env_id, clients, steps_each)
            remote = bench_remote(server.url, env_id, clients, steps_each, server=server)
            row = {
                "in_process": local,
                "server": remote,
                "throughput_ratio": remote["steps_per_s"] / local["steps_per_s"],
                "p50_ratio": remote["p50_ms"] / local["p50_ms"],
            }
            if clients == 1:  # the HTTP routes beside the stream door, in the same run
                row["server_http"] = bench_remote(server.url, env_id, 1, steps_each, "http", server)
            per_env["concurrency"][str(clients)] = row
            console.print(
                f"  {clients:>2} clients: server {remote['steps_per_s']:.0f} steps/s (p50 "
                f"{remote['p50_ms']:.2f} ms), in-process {local['steps_per_s']:.0f} steps/s (p50 "
                f"{local['p50_ms']:.2f} ms), errors {len(remote['errors'])}"
            )
        one = per_env["concurrency"].get("1")
        if one is not None:
            per_env["overhead_p50_ms"] = one["server"]["p50_ms"] - one["in_process"]["p50_ms"]
            per_env["overhead_p50_ms_http"] = one["server_http"]["p50_ms"] - one["in_process"]["p50_ms"]
            per_env["cpu_ms_per_step_1_client"] = {
                "in_process": one["in_process"]["cpu_ms_per_step"],
                "stream": one["server"]["cpu_ms_per_step"],
                "http": one["server_http"]["cpu_ms_per_step"],
            }
            console.print(
                f"  overhead p50 at 1 client: {per_env['overhead_p50_ms']:.2f} ms (stream door), "
                f"{per_env['overhead_p50_ms_http']:.2f} ms (HTTP routes)"
            )
        batch = per_env["batch"] = bench_batch(server.url, env_id, 32, settings.batch_rounds)
        if "32" in per_env["concurrency"]:
            in_process = per_env["concurrency"]["32"]["in_process"]["steps_per_s"]
            batch["vs_in_process_32"] = batch["batch_steps_per_s"] / in_process
        per_env["memory"] = bench_memory(server.url, env_id, settings.instances)
        if settings.openenv_rounds:
            console.print(f"  {settings.openenv_clients} native vs OpenEnv sessions")
            openenv = start_server(env_id, settings.workers, "openenv")
            try:
                steps = settings.openenv_steps or OPENENV_STEPS[env_id]
                compared = bench_vs_openenv(
                    server, openenv, env_id, settings.openenv_clients, steps, settings.openenv_rounds
                )
            finally:
                openenv.stop()
            ratio = compared["native"]["steps_per_s"] / compared["openenv"]["steps_per_s"]
            per_env[f"openenv_{settings.openenv_clients}"] = compared
            per_env[f"native_vs_openenv_{settings.openenv_clients}"] = ratio
            console.print(
                f"  native {compared['native']['steps_per_s']:.0f} steps/s, OpenEnv "
                f"{compared['openenv']['steps_per_s']:.0f} steps/s: native/OpenEnv x{ratio:.2f}"
            )
        metrics = requests.get(f"{server.url}/metrics", timeout=30).json()
        per_env["server_metrics"] = {k: v for k, v in metrics.items() if k != "workers"}
    finally:
        server.stop()
    per_env["load_average_after"] = list(os.getloadavg())
    return per_env


def plot(results: dict) -> None:
    """``hosting.png``: per env, the p50 step latency at 1 client (in process, the stream door, the HTTP
    routes) and the steps/s with 32 clients (in process, native, OpenEnv)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [env_id.split("/")[-1] for env_id in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (
        (
            axes[0],
            "p50 step latency at 1 client (ms)",
            [
                ("in process", lambda r: r["concurrency"].get("1", {}).get("in_process", {}).get("p50_ms")),
                ("stream door", lambda r: r["concurrency"].get("1", {}).get("server", {}).get("p50_ms")),
                ("HTTP routes", lambda r: r["concurrency"].get("1", {}).get("server_http", {}).get("p50_ms")),
            ],
        ),
        (
            axes[1],
            "steps/s, 32 clients",
            [
                (
                    "in process",
                    lambda r: r["concurrency"].get("32", {}).get("in_process", {}).get("steps_per_s"),
                ),
                ("native", lambda r: r.get("openenv_32", {}).get("native", {}).get("steps_per_s")),
                ("OpenEnv", lambda r: r.get("openenv_32", {}).get("openenv", {}).get("steps_per_s")),
            ],
        ),
    )
    for ax, label, series in panels:
        width = 0.8 / len(series)
        for k, (name, value) in enumerate(series):
            values = [value(results[env_id]) or 0.0 for env_id in results]
            ax.bar(
                [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))],
                values,
                width,
                label=name,
            )
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("progpo serve vs in process (one run, same machine)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def print_tables(results: dict, console: Console) -> None:
    """The results as two tables."""
    table = Table(title="Env server vs in-process")
    for column in [
        "env",
        "clients",
        "server steps/s",
        "in-proc steps/s",
        "ratio",
        "server p50/p99 ms",
        "in-proc p50/p99 ms",
        "errors",
    ]:
        table.add_column(column, justify="right" if column != "env" else "left")
    for env_id, per_env in results.items():
        for clients, row in per_env["concurrency"].items():
            s, loc = row["server"], row["in_process"]
            table.add_row(
                env_id.split("/")[-1],
                clients,
                f"{s['steps_per_s']:.0f}",
                f"{loc['steps_per_s']:.0f}",
                f"{row['throughput_ratio']:.2f}",
                f"{s['p50_ms']:.2f} / {s['p99_ms']:.1f}",
                f"{loc['p50_ms']:.2f} / {loc['p99_ms']:.1f}",
                str(len(s["errors"])),
            )
    console.print(table)
    extra = Table(title="Overhead, batch stepping, OpenEnv and memory")
    for column in [
        "env",
        "overhead p50 ms (stream / HTTP)",
        "1 batch request s (32)",
        "batch / in-process",
        "native / OpenEnv",
        "KiB / live instance",
    ]:
        extra.add_column(column)
    for env_id, per_env in results.items():
        b, m = per_env["batch"], per_env["memory"]
        ratio = next((v for k, v in per_env.items() if k.startswith("native_vs_openenv_")), None)
        extra.add_row(
            env_id.split("/")[-1],
            f"{per_env.get('overhead_p50_ms', float('nan')):.2f} / "
            f"{per_env.get('overhead_p50_ms_http', float('nan')):.2f}",
            f"{b['one_batch_request_s']:.3f}",
            f"{b['vs_in_process_32']:.2f}" if "vs_in_process_32" in b else "-",
            f"{ratio:.2f}" if ratio is not None else "-",
            f"{m['bytes_per_instance'] / 1024:.1f}",
        )
    console.print(extra)


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    if settings.quick:
        settings = dataclasses.replace(
            settings,
            steps=64,
            instances=8,
            batch_rounds=2,
            clients=[1, 8],
            fair_share_steps=60,
            greedy_threads=2,
            multi_server_steps=30,
            openenv_clients=8,
            openenv_steps=64,
            openenv_rounds=1,
        )
    console = Console()
    load_before = list(os.getloadavg())
    if settings.only == "multi_server":
        multi_server = bench_multi_server(settings, console)
        if not settings.quick:
            payload = json.loads(RESULT.read_text())
            payload["multi_server"] = multi_server_section(multi_server, settings)
            save_result(payload, RESULT)
            console.print(f"updated the multi_server section of {RESULT.relative_to(ROOT)}")
        return 0
    fair_share = bench_fair_share(
        settings.fair_share_steps, settings.greedy_threads, settings.workers, max_instances=64
    )
    alone, beside, greedy = fair_share["polite_alone"], fair_share["polite_with_greedy"], fair_share["greedy"]
    console.print(
        f"fair share: polite p99 alone {alone['p99_ms']:.1f} ms, beside the greedy client "
        f"{beside['p99_ms']:.1f} ms (x{fair_share['p99_ratio']:.2f}); greedy held {greedy['instances_held']} "
        f"instances, {greedy['creates_refused_429']} creates refused, "
        f"{fair_share['server']['worker_restarts']} worker restarts"
    )
    if settings.only == "fair_share":
        if not settings.quick:
            payload = json.loads(RESULT.read_text())
            payload["fair_share"] = fair_share_section(fair_share, settings)
            save_result(payload, RESULT)
            console.print(f"updated the fair_share section of {RESULT.relative_to(ROOT)}")
        return 0
    results: dict = {}
    for env_id in available_envs(settings.envs or list(ENVS), console):
        results[env_id] = measure_env(env_id, settings, console)
    print_tables(results, console)
    multi_server = bench_multi_server(settings, console)
    if settings.quick:
        return 0
    payload = {
        "benchmark": "hosting",
        "command": "python benchmarks/bench_hosting.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "clients": settings.clients,
            "steps": settings.steps or DEFAULT_STEPS,
            "workers": settings.workers,
            "instances": settings.instances,
            "openenv": {
                "clients": settings.openenv_clients,
                "steps_per_round": settings.openenv_steps or OPENENV_STEPS,
                "rounds": settings.openenv_rounds,
            },
            "env_kwargs": ENVS,
        },
        "notes": "Server: `progpo serve` in its own process on loopback (waitress, --workers env workers); "
        "clients: progpo/Remote-v0 (its default transport, the stream door; `server_http` at 1 client: the "
        "HTTP routes, transport='http'), one thread each, in this process. In-process baseline: the same "
        "number of env copies stepped round-robin in one process. overhead_p50_ms = server p50 - in-process "
        "p50 at 1 client (overhead_p50_ms_http for the HTTP routes); cpu_ms_per_step_1_client: CPU per step "
        "of this process (the client), the server's own process and its env workers. openenv_32: 32 native "
        "sessions against 32 OpenEnv sessions (`progpo serve --protocol openenv`, the same env workers, "
        "OpenEnv's GenericEnvClient on one event loop), rounds alternating after a warm-up, pooled; "
        "native_vs_openenv_32 = native steps/s / OpenEnv steps/s. batch.vs_in_process_32 = steps/s of one "
        "/batch/step request for 32 instances / in-process steps/s of 32 copies. Latencies are per step "
        "call; the machine is shared (load averages before and after, per env and for the run).",
        "machine": machine_info(
            processor=platform.processor(),
            load_average_before=load_before,
            load_average_after=list(os.getloadavg()),
        ),
        "results": results,
        "fair_share": fair_share_section(fair_share, settings),
        "multi_server": multi_server_section(multi_server, settings),
    }
    save_result(payload, RESULT)
    plot(results)
    console.print(f"wrote {RESULT.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    return 0


def fair_share_section(result: dict, settings: Settings) -> dict:
    """The ``fair_share`` section of the JSON: the result with how it was measured."""
    return {
        "command": "python benchmarks/bench_hosting.py --only fair_share"
        f" --fair-share-steps {settings.fair_share_steps} --greedy-threads {settings.greedy_threads}",
        "notes": "`progpo serve` hosting the toy env (progpo/ServerToy-v0) in its own process, --workers "
        "env workers, --max-instances 64, --client-tokens (two clients of one host, told apart by their "
        "tokens). Polite client: one instance, sequential single steps. Greedy client: every instance it may "
        "hold (the per-client share: half), each with the "
        "deepest history windows a client may ask for, stepped by concurrent 4,096-step batch requests. "
        "p99_ratio = polite p99 beside the greedy client / polite p99 alone, in the same run.",
        "machine": machine_info(processor=platform.processor(), load_average=list(os.getloadavg())),
        **result,
    }


# ------------------------------------------------------------------------------------------------------------
# The results page: this benchmark's section (benchmarks/report.py finds SPECS)
# ------------------------------------------------------------------------------------------------------------

SPECS = (
    Benchmark(
        "hosting",
        script_path(__file__),
        "Env server vs in-process envs: steps/s and latency at 1/8/32 clients, the overhead per step at 1 "
        "client (stream door and HTTP routes, with the CPU each process spends), native vs OpenEnv with 32 "
        "clients, "
        "batch stepping, memory per instance, many servers and fair sharing.",
        "python benchmarks/bench_hosting.py",
        ["--quick"],
    ),
)


if __name__ == "__main__":
    sys.exit(main())
