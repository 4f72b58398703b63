"""What the env, hosting and evaluation suites and the soak share: the envs they serve with their kwargs,
``progpo serve`` in its own process (either protocol), the random admissible actions their clients play and
the latency percentiles they report.

Example:
    >>> percentiles([0.001, 0.002, 0.003])["p50_ms"]
    2.0
    >>> choose(["search[<query>]"], random.Random(0))
    'search[cotton shirt for men]'
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np

from benchmarks.common import ServerProcess, free_port

ENVS = {
    "progpo/ALFWorld-v0": {"split": "train"},
    "progpo/WebShop-v0": {"num_products": 1000, "split": "test"},
}


def percentiles(latencies: list[float]) -> dict[str, float]:
    """The median, 99th percentile and mean of ``latencies`` (seconds) in milliseconds, and their number."""
    data = np.asarray(latencies or [0.0]) * 1000
    p50, p99 = np.percentile(data, [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_ms": float(data.mean()), "n": len(latencies)}


def choose(actions: list[str], rng: random.Random) -> str:
    """A random admissible action (a concrete query for WebShop's search placeholder)."""
    action = rng.choice(actions)
    return "search[cotton shirt for men]" if action.startswith("search[") else action


def available_envs(env_ids, console) -> list[str]:
    """The envs of ``env_ids`` that can be made here (each made once with its :data:`ENVS` kwargs); the others
    are reported on ``console`` and left out, not fatal."""
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


def serve_command(
    env_id: str,
    workers: int,
    port: int,
    protocol: str = "native",
    kwargs: dict | None = None,
    max_instances: int = 4096,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``progpo serve`` for one env on ``port`` with ``workers`` env workers (no AgentGym routes on the native
    protocol); ``kwargs`` as its ``--env-kwargs``; ``extra`` more flags."""
    command = [sys.executable, "-m", "progpo_envs.server.cli", "--protocol", protocol, *extra]
    command += ["--env", env_id]
    command += ["--port", str(port), "--workers", str(workers), "--max-instances", str(max_instances)]
    if kwargs is not None:
        command += ["--env-kwargs", f"{env_id}={json.dumps(kwargs)}"]
    return command + (["--agentgym", "none"] if protocol == "native" else [])


def start_server(env_id: str, workers: int, protocol: str = "native") -> ServerProcess:
    """``progpo serve`` for one env with its :data:`ENVS` kwargs in its own process (so clients and server do
    not share a GIL), ready (``/ready`` native, ``/health`` OpenEnv)."""
    port = free_port()
    command = serve_command(env_id, workers, port, protocol, ENVS[env_id])
    return ServerProcess(command, port, ready_path="/ready" if protocol == "native" else "/health")
