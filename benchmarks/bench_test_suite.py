"""How long the README's test command takes, and what it counts: ``benchmarks/results/test_suite.json``.

The README's ``.venv/bin/python -m pytest`` (the fast default set) from the repository root, a subprocess
with this Python: its wall time, exit status and counts (pytest's JUnit XML report), the machine, this
process's niceness and its load average at the start and end, and mean and maximum over the run (sampled
every :data:`LOAD_SAMPLE_S` seconds: on a shared machine, by how much the cores were wanted elsewhere). The
README and docs/quickstart.md quote the wall time. Rerun (15 to 25 minutes on 2 cores)::

    nice -n 10 .venv/bin/python benchmarks/bench_test_suite.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, child_env
from benchmarks.harness import Benchmark, Part, PartSettings, option, script_main, settings_record
from benchmarks.lib.processes import Sampler

#: The README's test command, as run from the repository root (``.venv/bin/python`` is this Python).
TEST_COMMAND = ("-m", "pytest")
#: Seconds between two samples of the load average while the tests run.
LOAD_SAMPLE_S = 15.0
#: The counts of a JUnit XML report's ``testsuite`` element: tests, failed, errors, skipped.
JUNIT_COUNTS = ("tests", "failures", "errors", "skipped")


@dataclass
class Settings(PartSettings):
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
    suites = list(ET.parse(junit_xml).getroot().iter("testsuite"))
    tests, failed, errors, skipped = (sum(int(s.get(k, 0)) for s in suites) for k in JUNIT_COUNTS)
    passed = tests - failed - errors - skipped
    return {"tests": tests, "passed": passed, "failed": failed, "errors": errors, "skipped": skipped}


def run(settings: Settings) -> dict:
    """The README's test command from the repository root: its wall time, exit status, counts, the load."""
    print(f"running `python {' '.join(TEST_COMMAND)}` in {ROOT} (the README's test command) ...", flush=True)
    load: list[float] = []
    with (
        tempfile.TemporaryDirectory() as scratch,
        Sampler(lambda: load.append(os.getloadavg()[0]), LOAD_SAMPLE_S),
    ):
        report = Path(scratch) / "junit.xml"
        started = time.perf_counter()
        try:
            command = [sys.executable, *TEST_COMMAND, f"--junitxml={report}"]
            status = subprocess.run(command, cwd=ROOT, env=child_env(), timeout=settings.timeout).returncode
        except subprocess.TimeoutExpired:
            status = None
        wall_s = time.perf_counter() - started
        found = counts(report) if report.is_file() else None
    load.append(os.getloadavg()[0])
    minutes, seconds = divmod(round(wall_s), 60)
    print(f"{minutes} min {seconds} s, exit status {status}, {found}", flush=True)
    return {
        "test_command": f"python {' '.join(TEST_COMMAND)}",
        "wall_s": wall_s,
        "exit_status": status,
        "timed_out": status is None,
        "counts": found,
        "load_average_1m_start": load[0],
        "load_average_1m_end": load[-1],
        "load_average_1m_mean": sum(load) / len(load),
        "load_average_1m_max": max(load),
        "load_samples": len(load),
        "niceness": os.nice(0),
        "settings": settings_record(settings),
        "failed": [] if status == 0 else [f"the test command's exit status was {status}"],
    }


SPECS = (Benchmark("test_suite", quick=False, command="nice -n 10 python benchmarks/bench_test_suite.py"),)


main = script_main(__name__, __file__, Part(Settings, run, name="test_suite"), SPECS, __doc__)
