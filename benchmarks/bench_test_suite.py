"""How long the README's test command takes, and what it counts: ``benchmarks/results/test_suite.json``.

The README's second command, ``.venv/bin/python -m pytest`` (the fast default set: ``pyproject.toml``'s
``addopts`` leave the ``slow`` tests out), run from the repository root as a subprocess of this script with
the same Python. Recorded: its wall time, its exit status, the tests collected, passed, failed, errored and
skipped (from pytest's JUnit XML report), the machine (:func:`benchmarks.common.machine_info`: CPU, cores,
packages, commit) and how loaded it was: the load average when the run started and ended and its mean and
maximum over the run (sampled every :data:`LOAD_SAMPLE_S` seconds), and this process's niceness. On a machine
shared with other jobs the wall time is longer than on an idle one; the load average says by how much the
cores were wanted elsewhere.

The README and docs/quickstart.md quote the wall time. Rerun (about 15 to 25 minutes on 2 cores)::

    nice -n 10 .venv/bin/python benchmarks/bench_test_suite.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, recorded_command, script_path

ROOT = Path(__file__).resolve().parents[1]
#: The README's test command, as run from the repository root (``.venv/bin/python`` is this Python).
TEST_COMMAND = ("-m", "pytest")
#: Seconds between two samples of the load average while the tests run.
LOAD_SAMPLE_S = 15.0


@dataclass
class Settings:
    out: str = option(str(RESULTS_DIR / "test_suite.json"), "result file")
    timeout: float = option(3600.0, "seconds the test command may take before it is stopped")


def counts(junit_xml: Path) -> dict[str, int]:
    """``tests``, ``passed``, ``failed``, ``errors`` and ``skipped`` of a pytest JUnit XML report.

    Example:
        >>> path = Path(tempfile.mkdtemp()) / "r.xml"
        >>> _ = path.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/>'
        ...                     '</testsuites>')
        >>> counts(path)
        {'tests': 5, 'passed': 2, 'failed': 1, 'errors': 0, 'skipped': 2}
    """
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in ET.parse(junit_xml).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    return {
        "tests": totals["tests"],
        "passed": passed,
        "failed": totals["failures"],
        "errors": totals["errors"],
        "skipped": totals["skipped"],
    }


class LoadSampler:
    """The 1-minute load average every :data:`LOAD_SAMPLE_S` seconds on a thread, until :meth:`stop`."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LOAD_SAMPLE_S):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return {
            "load_average_1m_start": self.samples[0],
            "load_average_1m_end": self.samples[-1],
            "load_average_1m_mean": sum(self.samples) / len(self.samples),
            "load_average_1m_max": max(self.samples),
            "load_samples": len(self.samples),
        }


def run_tests(timeout_s: float) -> dict:
    """Run the README's test command from the repository root; its wall time, exit status and counts."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        load = LoadSampler()
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, *TEST_COMMAND, f"--junitxml={report}"],
                cwd=ROOT,
                env=env,
                timeout=timeout_s,
            )
            status = done.returncode
        except subprocess.TimeoutExpired:
            status = None
        wall_s = time.perf_counter() - started
        machine_load = load.stop()
        found = counts(report) if report.is_file() else None
    return {
        "wall_s": wall_s,
        "exit_status": status,
        "timed_out": status is None,
        "counts": found,
        **machine_load,
    }


def main(argv: list[str] | None = None) -> int:
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    print(f"running `python {' '.join(TEST_COMMAND)}` in {ROOT} (the README's test command) ...", flush=True)
    run = run_tests(settings.timeout)
    result = {
        "benchmark": "test_suite",
        "command": recorded_command(script_path(__file__), argv if argv is not None else sys.argv[1:]),
        "test_command": f"python {' '.join(TEST_COMMAND)}",
        **run,
        "niceness": os.nice(0),
        "settings": asdict(settings),
        "machine": machine_info(load_average_1m_start=run["load_average_1m_start"]),
    }
    path = save_result(result, settings.out)
    minutes, seconds = divmod(round(run["wall_s"]), 60)
    print(f"{minutes} min {seconds} s, exit status {run['exit_status']}, {run['counts']}; wrote {path}")
    return 0 if run["exit_status"] == 0 else 1


SPECS = (
    Benchmark(
        "test_suite",
        script_path(__file__),
        "Wall time of the README's test command (`python -m pytest`, the fast default set) on this machine, "
        "with the tests passed, failed and skipped and the machine's load average over the run: the time the "
        "README and docs/quickstart.md quote, and the 20-minute ceiling the developers' guide sets for it.",
        "nice -n 10 python benchmarks/bench_test_suite.py",
        None,
    ),
)


if __name__ == "__main__":
    sys.exit(main())
