"""``progpo bench``: run the quick version of every benchmark, then regenerate ``benchmarks/README.md``.

Each result file of :data:`benchmarks.report.BENCHMARKS` is made by a suite's part run as a subprocess
(``sys.executable script PART ... --quick`` from the repository root, ``nice``-friendly,
``OMP_NUM_THREADS=1``; a quick run writes under ``runs/bench_quick/``, never over a committed result;
``--full`` runs the full settings, which do); a benchmark whose script is missing is skipped, one that fails
or runs past ``--timeout`` is reported and the others still run. Exit status: 0 when every benchmark that ran
succeeded, 1 otherwise; a mistyped command line is one line on stderr and exit status 2
(:func:`benchmarks.harness.parse_config`).

Example:
    >>> main(["--list"])  # doctest: +ELLIPSIS
    quickstart ...
    quickstart_async ...
    0
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from benchmarks.common import child_env
from benchmarks.harness import option, parse_config
from benchmarks.report import BENCHMARKS, PAGE, RESULTS_DIR, ROOT, render_page
from progpo_base.usage import one_of


def run_benchmark(script: str, args: list[str], timeout_s: float) -> tuple[str, float]:
    """Run one benchmark script; returns ``(status, seconds)`` with status ``ok`` / ``failed (rc N)`` /
    ``timed out``."""
    env = child_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timed out", time.perf_counter() - start
    status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    return status, time.perf_counter() - start


@dataclass
class Settings:
    only: list[str] | None = option(None, "run only these benchmarks (--list names them)", metavar="NAME")
    skip: list[str] = option([], "do not run these", metavar="NAME")
    full: bool = option(False, "run the full settings instead of the quick ones")
    timeout: float = option(1800.0, "seconds allowed per benchmark")
    report_only: bool = option(False, "only regenerate the results page")
    list_only: bool = option(False, "list the benchmarks and their quick commands", flag="--list")
    dry_run: bool = option(False, "print the commands without running them")

    def __post_init__(self):
        names = [b.name for b in BENCHMARKS]
        for name in [*(self.only or []), *self.skip]:
            if name not in names:
                raise one_of("benchmark", name, names)


def main(argv: list[str] | None = None) -> int:
    about = "Run the quick version of every benchmark and regenerate benchmarks/README.md."
    settings = parse_config(Settings, argv, about, prog="progpo bench")
    chosen = settings.only or [b.name for b in BENCHMARKS]
    selected = [b for b in BENCHMARKS if b.name in chosen and b.name not in settings.skip]
    if settings.list_only:
        for b in BENCHMARKS:
            quick = " ".join(b.quick_args) if b.quick_args is not None else "(no quick version)"
            present = "" if (ROOT / b.script).exists() else "  [script missing]"
            print(f"{b.name:20s} {b.script} {quick}{present}")
        return 0
    failures = 0
    if not settings.report_only:
        summary = []
        for b in selected:
            run_args = b.args if settings.full else b.quick_args
            if not (ROOT / b.script).exists():
                summary.append((b.name, "skipped (script missing)", 0.0))
                continue
            if run_args is None:
                summary.append((b.name, "skipped (no quick version)", 0.0))
                continue
            command = f"{sys.executable} {b.script} {' '.join(run_args)}".strip()
            print(f"==> {b.name}: {command}", flush=True)
            if settings.dry_run:
                summary.append((b.name, "dry run", 0.0))
                continue
            status, seconds = run_benchmark(b.script, run_args, settings.timeout)
            failures += status != "ok"
            summary.append((b.name, status, seconds))
        print("\nbenchmark            status                         seconds")
        for name, status, seconds in summary:
            print(f"{name:20s} {status:30s} {seconds:7.0f}")
    if not settings.dry_run:
        PAGE.write_text(render_page(RESULTS_DIR))
        print(f"wrote {PAGE}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
