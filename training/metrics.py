"""Metrics sinks: a JSONL file (the source of truth), TensorBoard, and the learning-curve PNG.

Every record is ``{"kind": "train"|"eval"|..., "iteration": i, ...numbers}``. On resume the JSONL file is cut
back to the records of completed iterations, so a resumed run's file equals an uninterrupted run's.

Example:
    >>> import tempfile
    >>> log = MetricsLog(Path(tempfile.mkdtemp()), tensorboard=False)
    >>> log.write({"kind": "train", "iteration": 1, "success": 0.5})
    >>> [r["success"] for r in log.read()]
    [0.5]
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: ``kind`` of the records of the held-out evaluation and of the evaluation on RL's own task pool.
HELD_OUT_EVAL_KIND = "eval"
RL_TASKS_EVAL_KIND = "eval_rl_tasks"

METRICS_FILE = "metrics.jsonl"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Append-only JSONL metrics with an optional TensorBoard mirror.

    Args:
        run_dir: Where ``metrics.jsonl`` and ``tensorboard/`` live.
        tensorboard: Mirror numeric values to TensorBoard (``<kind>/<name>`` tags).
        enabled: False on non-zero ranks (nothing is written).
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self._writer = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (and mirror its numbers to TensorBoard)."""
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        if self._writer is not None:
            kind, step = record.get("kind", "train"), int(record.get("iteration", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
                    self._writer.add_scalar(f"{kind}/{key}", value, step)
            self._writer.flush()

    def read(self) -> list[dict[str, Any]]:
        """All records."""
        if not self.path.is_file():
            return []
        return [
            json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]

    def truncate_after(self, iteration: int) -> None:
        """Drop records of iterations after ``iteration`` (written by a killed run past its checkpoint)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [r for r in self.read() if int(r.get("iteration", 0)) <= iteration]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept), encoding="utf-8")
        tmp.replace(self.path)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._writer is not None:
            self._writer.close()


def plot_learning_curve(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Training success per iteration and validation success (mean ± spread over seeds) to a PNG."""
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == HELD_OUT_EVAL_KIND]
    rl_task_evals = [r for r in records if r.get("kind") == RL_TASKS_EVAL_KIND]
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if train:
        axes[0].plot(
            [r["iteration"] for r in train],
            [r.get("success") or 0 for r in train],
            marker="o",
            label="train success (sampled, T=train)",
        )
        axes[0].plot(
            [r["iteration"] for r in train],
            [r.get("invalid_rate") or 0 for r in train],
            marker=".",
            label="invalid-action rate",
        )
        axes[0].plot(
            [r["iteration"] for r in train],
            [r.get("admissible_rate") or 0 for r in train],
            marker=".",
            label="admissible-action rate",
        )
    if evals:
        xs = [r["iteration"] for r in evals]
        means = [r.get("success") or 0 for r in evals]
        spread = [r.get("success_std") or 0 for r in evals]
        axes[0].errorbar(xs, means, yerr=spread, marker="s", capsize=3, label="held-out success (mean ± std)")
    if rl_task_evals:
        axes[0].errorbar(
            [r["iteration"] for r in rl_task_evals],
            [r.get("success") or 0 for r in rl_task_evals],
            yerr=[r.get("success_std") or 0 for r in rl_task_evals],
            marker="D",
            capsize=3,
            label="success on RL's own tasks (mean ± std)",
        )
    axes[0].set_xlabel("iteration")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    axes[0].set_title("success")
    if train:
        for key in ("kl", "entropy"):
            axes[1].plot([r["iteration"] for r in train], [r.get(key) or 0 for r in train], label=key)
        axes[1].set_xlabel("iteration")
        axes[1].legend(fontsize=7)
        axes[1].set_title("KL to reference, entropy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
