"""What every benchmark records beside its numbers, and the server process some of them measure.

A result file (``benchmarks/results/<name>.json``) names the machine it was measured on (:func:`machine_info`:
CPU count, Python, platform, plus what the benchmark's numbers depend on, such as library versions or the load
of a shared machine) and, for the long comparisons, the commit (:func:`git_commit`); :func:`save_result`
writes it. A benchmark of an HTTP server starts the server in its own process (:class:`ServerProcess`, on a
:func:`free_port`), so that clients and server do not share a GIL, and waits until it answers its readiness
URL.

Benchmark scripts run as ``python benchmarks/<script>.py``, so each puts the repository root on ``sys.path``
before it imports this module.

Example:
    >>> import json, sys
    >>> result = {"benchmark": "demo", "machine": machine_info(numpy="1.26.4")}
    >>> sorted(result["machine"])
    ['cpu_count', 'numpy', 'platform', 'python']
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
import platform
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"


def machine_info(**extra: Any) -> dict[str, Any]:
    """The machine a result was measured on: ``cpu_count``, ``python`` (its version), ``platform``, ``extra``.

    Args:
        **extra: what else the benchmark's numbers depend on, under the key its result file uses (for example
            ``torch=torch.__version__`` or ``load_average_1m=os.getloadavg()[0]``).
    """
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **extra,
    }


def git_commit() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository (read-only git calls); dirty =
    changed or untracked files exist, i.e. the numbers may come from code that is not in that commit."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if sha.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": sha.stdout.strip(), "dirty": bool(status.stdout.strip())}


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
