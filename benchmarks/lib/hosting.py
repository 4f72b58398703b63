"""What the two hosting benchmarks (:mod:`benchmarks.bench_hosting`, :mod:`benchmarks.bench_openenv`) share:
the envs they serve, with their kwargs, the servers (``progpo serve`` in its own process, either protocol),
the random admissible actions, OpenEnv's client sessions and the latency percentiles they report.

Example:
    >>> percentiles([0.001, 0.002, 0.003])["p50_ms"]
    2.0
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import numpy as np

from benchmarks.common import ServerProcess, free_port

ENVS = {
    "progpo/ALFWorld-v0": {"split": "train"},
    "progpo/WebShop-v0": {"num_products": 1000, "split": "test"},
}


def percentiles(latencies: list[float]) -> dict[str, float]:
    """The median and 99th percentile of ``latencies`` (seconds), in milliseconds."""
    data = np.asarray(latencies) * 1000
    return {"p50_ms": float(np.percentile(data, 50)), "p99_ms": float(np.percentile(data, 99))}


def available_envs(env_ids, console) -> list[str]:
    """The envs of ``env_ids`` that can be made here (each one made once with its :data:`ENVS` kwargs); the
    others are reported on ``console`` and left out, not fatal."""
    import gymnasium as gym

    available = []
    for env_id in env_ids:
        try:
            gym.make(env_id, **ENVS[env_id]).close()
        except Exception as exc:  # noqa: BLE001 - an env not available here is reported, not fatal
            console.print(f"[yellow]skipping {env_id}: {exc!r}")
            continue
        available.append(env_id)
    return available


def choose(actions: list[str], rng: random.Random) -> str:
    """A random admissible action (a concrete query for WebShop's search placeholder)."""
    action = rng.choice(actions)
    return "search[cotton shirt for men]" if action.startswith("search[") else action


def start_server(env_id: str, workers: int, protocol: str = "native") -> ServerProcess:
    """``progpo serve`` for one env in its own process (so clients and server do not share a GIL), its
    ``--workers`` env workers up, 4096 instances at most, no AgentGym routes; ready (``/ready`` native,
    ``/health`` OpenEnv)."""
    port = free_port()
    command = [sys.executable, "-m", "progpo_envs.server.cli", "--protocol", protocol, "--env", env_id]
    command += ["--port", str(port), "--workers", str(workers), "--max-instances", "4096"]
    command += ["--env-kwargs", f"{env_id}={json.dumps(ENVS[env_id])}"]
    if protocol == "native":
        command += ["--agentgym", "none"]
    return ServerProcess(command, port, ready_path="/ready" if protocol == "native" else "/health")


def openenv_actions(observation: dict) -> list[str]:
    """The admissible action strings of an OpenEnv observation (WebShop's from its available actions)."""
    if "admissible_actions" in observation:
        return observation["admissible_actions"]
    available = observation["available_actions"]
    return (["search[query]"] if available["has_search_bar"] else []) + [
        f"click[{c}]" for c in available["clickables"]
    ]


def run_openenv_async(url: str, clients: int, steps_each: int) -> dict:
    """``clients`` async OpenEnv ``GenericEnvClient`` sessions on one event loop, client ``i`` reset with
    seed ``i`` and acting from ``random.Random(i)``: ``{latencies, elapsed_s, errors}``."""
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
                    result = await session.step({"command": choose(openenv_actions(observation), rng)})
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


def pooled(runs: list[dict]) -> dict:
    """Rounds of one protocol together: steps/s over the total time, latency percentiles of every call."""
    latencies = [x for run in runs for x in run["latencies"]]
    elapsed = sum(run["elapsed_s"] for run in runs)
    return {
        "steps": len(latencies),
        "elapsed_s": elapsed,
        "steps_per_s": len(latencies) / elapsed,
        **percentiles(latencies),
        "steps_per_s_by_round": [len(run["latencies"]) / run["elapsed_s"] for run in runs],
        "errors": [e for run in runs for e in run["errors"]],
    }
