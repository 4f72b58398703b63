"""Training runs as the benchmarks start and read them: ``progpo train`` as a subprocess (under ``torchrun``
for several processes) and its run folder's ``metrics.jsonl``.

Example:
    >>> train_command(["iterations=0"])[1:]
    ['-m', 'training.cli', 'iterations=0']
    >>> read_metrics(Path("/nonexistent"))
    []
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def train_command(arguments: list[str], processes: int = 1) -> list[str]:
    """``python -m training.cli arguments`` (``progpo train``), under ``torchrun`` for ``processes`` > 1."""
    if processes == 1:
        return [sys.executable, "-m", "training.cli", *arguments]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--standalone", "--nproc_per_node", str(processes), "-m", "training.cli", *arguments]


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` ([] when absent)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_records(run_dir: Path) -> list[dict]:
    """The per-iteration training records of a run."""
    return [r for r in read_metrics(run_dir) if r.get("kind") == "train"]
