"""Run a command and report the peak memory of its whole process tree (every rank, every vLLM engine).

``/usr/bin/time -v`` reports the largest single process; a torchrun job is several processes whose memory
adds up against the machine's. This samples the tree every ``--interval`` seconds and reports the largest sum
of proportional set sizes (PSS: shared pages split among the processes that map them, so a page counts once)
and of resident set sizes (RSS: shared pages counted in every process, an upper bound), with the command's
wall time and exit status.

Example (what ``docs/training.md`` records for the 2-rank vLLM rehearsal)::

    .venv-vllm/bin/python scripts/peak_memory.py --out /tmp/mem.json -- \\
        .venv-vllm/bin/python -m pytest -m vllm tests/training/test_vllm_rehearsal.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """``(PSS bytes, RSS bytes, processes)`` summed over ``root`` and its descendants alive now."""
    pss = rss = count = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
        count += 1
    return pss, rss, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--out", help="also write the result as JSON here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    started = time.perf_counter()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak_pss = peak_rss = peak_processes = 0
    while child.poll() is None:
        pss, rss, count = tree_memory(root)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        peak_processes = max(peak_processes, count)
        time.sleep(args.interval)
    result = {
        "command": command,
        "returncode": child.returncode,
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_pss_gib": round(peak_pss / 2**30, 2),
        "peak_rss_gib": round(peak_rss / 2**30, 2),
        "peak_processes": peak_processes,
        "machine_memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    print(json.dumps(result), file=sys.stderr)
    if args.out:
        with open(args.out, "w") as sink:
            json.dump(result, sink, indent=2)
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main())
