"""What every benchmark records beside its numbers, and the processes some of them measure.

A result file (``benchmarks/results/<name>.json``) names what it was measured with (:func:`machine_info`: the
CPU's model and flags, Python, platform, torch's build, the package versions and the commit, the record every
training run keeps too (:mod:`training.provenance`), plus what else the numbers depend on, such as the load of
a shared machine); :func:`save_result` writes it. A benchmark of an HTTP server starts the server in its own
process (:class:`ServerProcess`, on a :func:`free_port`), so that clients and server do not share a GIL, and
waits until it answers its readiness URL; :func:`run_measured` runs a command and records its wall time, CPU
time and peak memory.

A benchmark runs as ``python benchmarks/<suite>.py PART`` from the repository root (``scripts/setup.sh``
installs the project editable, so no script edits ``sys.path``).

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
import shlex
import socket
import subprocess
import sys
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
    """The machine, software and code a result was measured with (:func:`training.provenance.environment`),
    then ``extra``: what else the numbers depend on, under the key the result file uses."""
    return {**environment(), **extra}


def save_result(result: dict[str, Any], path: Path | str) -> Path:
    """Write ``result`` as indented JSON to ``path`` (its folder made if missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def shown(path: Path | str) -> str:
    """``path`` relative to the repository root when it lies inside it (as result files record paths)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that imports the project from this checkout, plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_measured(
    command: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``command`` from the repository root, its output to ``log``; ``{status, returncode, command,
    resources}`` with status ``ok`` / ``failed`` / ``timeout`` and the process's ``wall_s``, ``user_cpu_s``,
    ``system_cpu_s`` and ``peak_rss_gb`` (decimal GB; :func:`os.wait4`: its children included)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env or child_env(), stdout=out, stderr=out)
        timed_out = False
        while not (done := os.wait4(process.pid, os.WNOHANG))[0]:
            if time.perf_counter() - started > timeout_s:
                process.kill()
                done, timed_out = os.wait4(process.pid, 0), True
                break
            time.sleep(1.0)
    _, wait_status, usage = done
    returncode = process.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped: Popen must not wait
    resources = {"wall_s": time.perf_counter() - started, "user_cpu_s": usage.ru_utime}
    resources.update(system_cpu_s=usage.ru_stime, peak_rss_gb=usage.ru_maxrss * 1024 / 1e9)  # Linux: KiB
    shown = ["python", *command[1:]] if command[0] == sys.executable else command
    status = "timeout" if timed_out else "ok" if returncode == 0 else "failed"
    return {"status": status, "returncode": returncode, "command": shlex.join(shown), "resources": resources}


def run_child(
    args: list[str], python: str = sys.executable, timeout_s: float | None = None, **env: str
) -> dict:
    """Run ``python <args> --out <a temporary file>`` (a suite's part in a process of its own, so that its
    memory or its Python is its own) from the repository root and return the result it wrote.

    Raises:
        RuntimeError: the process failed or wrote no result (the message ends with its last output line).
        subprocess.TimeoutExpired: it ran past ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-child-") as folder:
        out = Path(folder) / "result.json"
        command = [python, *args, "--out", str(out)]
        done = subprocess.run(
            command, cwd=ROOT, env=child_env(**env), capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
            raise RuntimeError(f"{shlex.join(args[:2])}: exit {done.returncode}: {tail}")
        return json.loads(out.read_text())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server command in its own process (cwd: the repository root), ready once ``GET url + ready_path``
    answers 200; its output goes to a temporary file, shown when it fails to start. A context manager.

    Raises:
        RuntimeError: the server exited, or was not ready within ``timeout_s`` (it is then stopped); the
            message ends with the last of its output.
    """

    def __init__(self, command: list[str], port: int, ready_path: str, timeout_s: float = 300.0, env=None):
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
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    mean, low, high = float(arr.mean()), float(arr.min()), float(arr.max())
    return {"mean": mean, "std": std, "min": low, "max": high, "n": arr.size}


def paired_differences(
    runs: list[dict[str, Any]], metric: str = "success", baseline: str = "grpo"
) -> dict[str, dict[str, Any]]:
    """Per ``env / estimator``: ``metric`` minus the ``baseline`` estimator's, paired by env and seed (runs of
    one env and seed share the warm start, RL seed and evaluation tasks, so the difference removes the noise
    they share), as :func:`mean_spread` over seeds. Seeds where either run has no ``metric`` are left out.

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
        values = diffs.setdefault(f"{r['env']} / {r['estimator']}", [])
        if metric in r.get("final", {}) and (r["env"], r["seed"]) in base:
            values.append(r["final"][metric] - base[(r["env"], r["seed"])])
    return {key: mean_spread(values) for key, values in diffs.items()}
