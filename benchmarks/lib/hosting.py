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
