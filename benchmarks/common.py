"""What every benchmark records beside its numbers, and the server process some of them measure.

A result file (``benchmarks/results/<name>.json``) names what it was measured with (:func:`machine_info`: the
CPU's model and flags, Python, platform, torch's build, the package versions and the commit, the record every
training run keeps too (:mod:`training.provenance`), plus what else the benchmark's numbers depend on, such
as the load of a shared machine); :func:`save_result` writes it. A benchmark of an HTTP server starts the
server in its own process (:class:`ServerProcess`, on a :func:`free_port`), so that clients and server do not
share a GIL, and waits until it answers its readiness URL.

A benchmark runs as a module, ``python -m benchmarks.<name>`` from the repository root; ``python
benchmarks/<name>.py`` works too, because ``scripts/setup.sh`` installs the project (editable), so no script
edits ``sys.path``.

Example:
    >>> import json, sys
    >>> result = {"benchmark": "demo", "machine": machine_info(numpy="1.26.4")}
    >>> [key for key in result["machine"] if key.startswith("cpu") or key in ("git", "numpy")]
    ['cpu_model', 'cpu_flags', 'cpu_count', 'git', 'numpy']
    >>> path = save_result(result, Path("results") / "demo.json")  # the folder is made
    >>> json.loads(path.read_text())["benchmark"]
    'demo'
    >>> port = free_port()
    >>> command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    >>> with ServerProcess(command, port, ready_path="/") as server:
    ...     requests.get(server.url, timeout=10).status_code
    200
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from training.provenance import environment
from training.provenance import git_commit as git_commit  # one implementation, re-exported for the benchmarks
from training.provenance import weights_digest as weights_digest  # the digest progpo train's summary records

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"


def machine_info(**extra: Any) -> dict[str, Any]:
    """The machine, software and code a result was measured with: :func:`training.provenance.environment`
    (CPU model and flags, ``cpu_count``, ``python``, ``platform``, torch's build, every package's version,
    the commit), then ``extra``.

    Args:
        **extra: what else the benchmark's numbers depend on, under the key its result file uses (for example
            ``torch_threads=torch.get_num_threads()`` or ``load_average_1m=os.getloadavg()[0]``).
    """
    return {**environment(), **extra}


def save_result(result: dict[str, Any], path: Path | str) -> Path:
    """Write ``result`` as indented JSON to ``path`` (its folder made if missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server command in its own process (cwd: the repository root), ready once ``GET url + ready_path``
    answers 200. Its output goes to a temporary file, shown when it fails to start. A context manager; or call
    :meth:`stop`.

    Args:
        command: the server's command line; it must listen on ``127.0.0.1:port``.
        port: the port it listens on (see :func:`free_port`).
        ready_path: its readiness endpoint, e.g. ``/ready`` (env server) or ``/api/health`` (WebShop site).
        timeout_s: how long to wait for it to be ready.
        env: environment variables set for the server on top of this process's.

    Raises:
        RuntimeError: the server exited, or was not ready within ``timeout_s`` (it is then stopped); the
            message ends with the last of its output.
    """

    def __init__(
        self,
        command: list[str],
        port: int,
        ready_path: str,
        timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ):
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})}
        )
        try:
            self._wait_ready(ready_path, timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_ready(self, ready_path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited (rc {self.process.returncode}):\n{self._log_tail()}")
            try:
                if requests.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s:\n{self._log_tail()}")

    def _log_tail(self, chars: int = 4000) -> str:
        self.log.seek(0)
        return self.log.read()[-chars:]

    def stop(self) -> None:
        """Terminate the server and wait for it to exit (kill it if it has not within a minute)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def mean_spread(values: list[float]) -> dict[str, Any]:
    """Mean, sample std (n-1; 0 for one value), min, max and n of one number over seeds.

    Example:
        >>> s = mean_spread([0.25, 0.5, 0.75])
        >>> s["mean"], round(s["std"], 3), s["n"], mean_spread([])["mean"]
        (0.5, 0.25, 3, None)
    """
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "min": float(arr.min()),
        "max": float(arr.max()),
        "n": int(arr.size),
    }


def paired_differences(
    runs: list[dict[str, Any]], metric: str = "success", baseline: str = "grpo"
) -> dict[str, dict[str, Any]]:
    """Per ``env / estimator``: ``metric`` minus the ``baseline`` estimator's, paired by env and seed.

    Runs with the same env and seed start from the same warm start with the same RL seed, and their held-out
    evaluations play the same tasks with the same sampling seeds, so the per-seed difference removes the
    noise the estimators share; its mean and sample std over seeds (:func:`mean_spread`) say whether an
    estimator beats the baseline by more than that spread. Seeds where either run has no ``metric`` are left
    out; the baseline itself is not listed.

    Example:
        >>> runs = [
        ...     {"env": "e", "estimator": "grpo", "seed": 0, "final": {"success": 0.25}},
        ...     {"env": "e", "estimator": "progpo", "seed": 0, "final": {"success": 0.5}},
        ...     {"env": "e", "estimator": "progpo", "seed": 1, "final": {"success": 0.5}},
        ... ]
        >>> paired_differences(runs)["e / progpo"]["mean"], paired_differences(runs)["e / progpo"]["n"]
        (0.25, 1)
    """
    base = {
        (r["env"], r["seed"]): r["final"][metric]
        for r in runs
        if r["estimator"] == baseline and metric in r.get("final", {})
    }
    diffs: dict[str, list[float]] = {}
    for r in runs:
        if r["estimator"] == baseline:
            continue
        key = f"{r['env']} / {r['estimator']}"
        diffs.setdefault(key, [])
        if metric in r.get("final", {}) and (r["env"], r["seed"]) in base:
            diffs[key].append(r["final"][metric] - base[(r["env"], r["seed"])])
    return {key: mean_spread(values) for key, values in diffs.items()}


def save_figure(fig, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` as the results page shows plots (110 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
