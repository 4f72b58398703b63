"""What the two hosting benchmarks (:mod:`benchmarks.bench_hosting`, :mod:`benchmarks.bench_openenv`) share:
the envs they serve, with their kwargs, and the latency percentiles they report.

Example:
    >>> percentiles([0.001, 0.002, 0.003])["p50_ms"]
    2.0
"""

from __future__ import annotations

import numpy as np

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
