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
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from training.config import RolloutConfig
    from training.distributed import DistContext
    from training.rollout import Episode, RolloutResult, StepRows

#: ``kind`` of the records of the held-out evaluation and of the evaluation on RL's own task pool.
HELD_OUT_EVAL_KIND = "eval"
RL_TASKS_EVAL_KIND = "eval_rl_tasks"

METRICS_FILE = "metrics.jsonl"


def episode_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Success overall and per task type, return (``score``), the env's task score when it reports one
    (``task_score``: WebShop's 0–1 purchase score), steps (all episodes, and ``success_steps``: won ones only)
    and invalid-action rate of a list of episodes, and their count (``episodes``).

    An episode a lost env server ended (:attr:`~training.rollout.Episode.env_error`) is not scored: it is
    counted in ``env_failed_episodes`` alone (an infrastructure fault is not the policy's failure).
    """
    if not episodes:
        return {}
    env_failed = sum(e.env_error is not None for e in episodes)
    counts = {f"{prefix}env_failed_episodes": float(env_failed)}
    episodes = [e for e in episodes if e.env_error is None]
    if not episodes:
        return {f"{prefix}episodes": 0.0, **counts}
    task_scores = [e.task_score for e in episodes if e.task_score is not None]
    won_steps = [e.steps for e in episodes if e.won]
    out = {
        f"{prefix}success": float(np.mean([e.won for e in episodes])),
        f"{prefix}score": float(np.mean([e.score for e in episodes])),
        **({f"{prefix}task_score": float(np.mean(task_scores))} if task_scores else {}),
        f"{prefix}episode_steps": float(np.mean([e.steps for e in episodes])),
        # steps to success: the mean length of the won episodes only (absent when none was won)
        **({f"{prefix}success_steps": float(np.mean(won_steps))} if won_steps else {}),
        f"{prefix}invalid_rate": float(
            sum(e.invalid_steps for e in episodes) / max(1, sum(e.steps for e in episodes))
        ),
        f"{prefix}episodes": float(len(episodes)),
        **counts,
    }
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        if e.task_type:  # WebShop goals have no type: their per-type entry would repeat ``success``
            by_type[e.task_type].append(e.won)
    for task_type, wins in sorted(by_type.items()):
        out[f"{prefix}success/{task_type}"] = float(np.mean(wins))
    return out


def exact_prefix_peer_fraction(rows: StepRows) -> float:
    """Fraction of step rows whose exact history prefix (task + all pairs + state) occurs in another
    trajectory of the same group: the rows ProGPO's exact-prefix peer comparison applies to."""
    if rows.num_rows == 0:
        return 0.0
    trajs: dict[tuple[int, int], set[int]] = defaultdict(set)
    for g, h, t in zip(rows.group_id, rows.history_key, rows.traj_id, strict=True):
        trajs[(g, h)].add(t)
    keys = zip(rows.group_id, rows.history_key, strict=True)
    return float(np.mean([len(trajs[(g, h)]) > 1 for g, h in keys]))


def value_stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    """``{prefix_mean, prefix_std, prefix_min, prefix_max}`` of ``values`` (nothing when empty).

    Example:
        >>> value_stats("advantage", np.array([1.0, 3.0]))
        {'advantage_mean': 2.0, 'advantage_std': 1.0, 'advantage_min': 1.0, 'advantage_max': 3.0}
    """
    if values.size == 0:
        return {}
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


def staleness_metrics(counts: Sequence[float]) -> dict[str, float]:
    """The staleness histogram of a batch's rows: ``counts[k]`` rows sampled ``k`` policy versions before
    the update that trains on them. ``staleness/k`` is the share of rows at ``k`` (every ``k`` up to
    ``rollout.max_staleness``, so the histogram's bins are the same keys in every record), with the mean and
    the largest staleness seen.

    Example:
        >>> staleness_metrics([6.0, 2.0])
        {'staleness/0': 0.75, 'staleness/1': 0.25, 'staleness_mean': 0.25, 'staleness_max': 1.0}
    """
    total = float(sum(counts))
    out = {f"staleness/{k}": (c / total if total else 0.0) for k, c in enumerate(counts)}
    out["staleness_mean"] = sum(k * c for k, c in enumerate(counts)) / total if total else 0.0
    out["staleness_max"] = float(max((k for k, c in enumerate(counts) if c), default=0))
    return out


def train_metrics(
    iteration: int,
    result: RolloutResult,
    advantages: np.ndarray,
    update_stats: dict[str, float],
    staleness: np.ndarray,
    marks: dict[str, float],
    dist: DistContext,
    rollout: RolloutConfig,
) -> dict[str, float]:
    """The ``kind: train`` record of iteration ``iteration`` (0-based; recorded as ``iteration + 1``): its
    episodes (gathered from every rank: a collective; those of a group an env failure cut short only counted,
    in ``env_failed_episodes``), update statistics, advantages, rows, phase times from
    ``marks`` (``time.perf_counter()`` at ``start``, ``rollout``, ``advantages``, ``update``, ``sync``),
    throughputs and the staleness histogram (``staleness``: per row, policy versions behind; its bins up to
    ``rollout.max_staleness``)."""
    asynchronous, rows = rollout.mode == "async", result.rows
    episodes = [e for part in dist.gather_objects(result.episodes) for e in part]
    # a group an env failure cut short is out of the batch (training.update.rows_to_train), and out of the
    # success too: its episodes that ended before the failure are the short ones, won more often
    lost = {e.group_id for e in episodes if e.env_error is not None}
    episodes = [e for e in episodes if e.group_id not in lost or e.env_error is not None]
    # wall-clock throughput of the batch's rollout, comparable across modes: lock step's is the rollout
    # phase, an asynchronous batch's runs from its first group's start to its last one's end
    span = result.sample_seconds if asynchronous else marks["rollout"] - marks["start"]
    histogram = np.bincount(staleness.clip(min=0), minlength=rollout.max_staleness + 1)
    update_seconds = marks["update"] - marks["advantages"]
    return {
        "kind": "train",
        "iteration": iteration + 1,
        **episode_metrics(episodes),
        **update_stats,
        **value_stats("advantage", advantages),
        "rows": float(dist.all_reduce_sum(rows.num_rows)),
        "valid_rate": float(np.mean(rows.valid)) if rows.num_rows else 0.0,
        "admissible_rate": float(np.mean(rows.admissible)) if rows.num_rows else 0.0,
        "exact_prefix_peer_fraction": exact_prefix_peer_fraction(rows),
        "time_rollout": marks["rollout"] - marks["start"],
        "time_advantage": marks["advantages"] - marks["rollout"],
        "time_update": update_seconds,
        "time_sync": marks["sync"] - marks["update"],
        "time_iteration": marks["sync"] - marks["start"],
        "rollout_tokens_per_s": result.generated_tokens / max(result.sample_seconds, 1e-9),
        "env_steps_per_s": result.env_steps / max(result.env_seconds, 1e-9),
        "time_rollout_span": span,
        "rollout_wall_tokens_per_s": result.generated_tokens / max(span, 1e-9),
        "rollout_wall_env_steps_per_s": result.env_steps / max(span, 1e-9),
        "rollout_groups_dropped": float(dist.all_reduce_sum(result.groups_dropped)),
        **staleness_metrics([float(dist.all_reduce_sum(int(c))) for c in histogram]),
        "update_tokens_per_s": update_stats.get("update_tokens", 0.0) / max(update_seconds, 1e-9),
    }


#: The numbers of each env server's status that :func:`server_metrics` records.
SERVER_COUNTS = ("groups", "sessions", "failed_episodes", "lost_groups", "moved_groups", "errors")


def server_metrics(servers: Sequence[dict[str, Any]], dist: DistContext | None = None) -> dict[str, float]:
    """Each env server's share of a run on several (:func:`agents.envs.server_status`, per rank): for server
    ``i`` (in the list's order) ``server/i/up``, the share of ranks that see it up, and ``server/i/<count>``
    for each of :data:`SERVER_COUNTS` summed over the ranks (groups and sessions held now; episodes its
    failures ended, groups lost or moved off it, errors: since the start). Nothing for one server or none.
    With ``dist`` a collective when there are servers (every rank plays on the same list); without, this
    process's alone.

    Example:
        >>> servers = [{"url": "http://a:8000", "state": "up", "groups": 2, "sessions": 8}]
        >>> server_metrics(servers)["server/0/sessions"], server_metrics(servers)["server/0/up"]
        (8.0, 1.0)
    """

    def total(value: float) -> float:
        return float(value) if dist is None else dist.all_reduce_sum(float(value))

    ranks = 1 if dist is None else max(dist.world_size, 1)
    out: dict[str, float] = {}
    for i, server in enumerate(servers):
        out[f"server/{i}/up"] = total(server["state"] == "up") / ranks
        for name in SERVER_COUNTS:
            out[f"server/{i}/{name}"] = total(server.get(name, 0))
    return out


def engine_loop_metrics(
    counters: dict[str, tuple[float, int, int]], marks: dict[str, float]
) -> dict[str, float]:
    """The engine loop's share of an iteration (``rollout.mode=async``), from its ``(busy seconds, steps,
    tokens)`` counters at ``start``, ``update`` (the update's start), ``updated`` and ``end``, and the
    iteration's ``marks`` (:func:`train_metrics`)."""
    busy, steps, tokens = (a - b for a, b in zip(counters["end"], counters["start"], strict=True))
    # the engine's decoding during the update: the next batches' rollouts overlapping it
    overlap = counters["updated"][0] - counters["update"][0]
    return {
        "engine_busy_frac": busy / max(marks["sync"] - marks["start"], 1e-9),
        "engine_tokens_per_step": tokens / max(steps, 1),
        "rollout_update_overlap": overlap / max(marks["update"] - marks["advantages"], 1e-9),
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` ([] when it has none), as :class:`MetricsLog` wrote them."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


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
        return read_metrics(self.path.parent)

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

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
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
        # separate measurements (before RL, every eval.every, after): points, not a line between them
        axes[0].errorbar(
            xs,
            means,
            yerr=spread,
            marker="s",
            linestyle="none",
            capsize=3,
            label="held-out success (mean ± std)",
        )
    if rl_task_evals:
        axes[0].errorbar(
            [r["iteration"] for r in rl_task_evals],
            [r.get("success") or 0 for r in rl_task_evals],
            yerr=[r.get("success_std") or 0 for r in rl_task_evals],
            marker="D",
            linestyle="none",
            capsize=3,
            label="success on RL's own tasks (mean ± std)",
        )
    axes[0].set_xlabel("iteration")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2)  # below: off the curves
    axes[0].set_title("success")
    if train:
        for key in ("kl", "entropy"):
            axes[1].plot([r["iteration"] for r in train], [r.get(key) or 0 for r in train], label=key)
        axes[1].set_xlabel("iteration")
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2)
        axes[1].set_title("KL to reference, entropy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
