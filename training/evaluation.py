"""Success measured during training: on the held-out split, and on RL's own task pool, before and after RL.

An :class:`Evaluation` names what is measured (``eval.num_tasks`` tasks spread over ``env.eval_split``, and
with ``eval.rl_tasks`` every task of ``rollout.task_pool``); :class:`Evaluator` plays it with the rollout
engine, each task once per sampling seed (``eval.seeds``), the tasks shared out over ranks, and returns the
metrics record: success mean, its spread over seeds, per task type, invalid and admissible rates.
:class:`RunEvaluations` schedules them in a training run (before RL, every ``eval.every`` iterations, after
RL) and keeps their records, which the run checkpoints.

Example:
    >>> from training.config import TrainConfig
    >>> [e.name for e in evaluations(TrainConfig())]  # the quickstart measures both
    ['held-out', 'RL-task']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from agents.envs import num_tasks, spread_tasks
from training.config import TrainConfig
from training.distributed import DistContext
from training.engines import GenerationEngine
from training.envs import make_split_envs
from training.metrics import HELD_OUT_EVAL_KIND, RL_TASKS_EVAL_KIND, MetricsLog, episode_metrics
from training.rollout import RolloutWorker
from training.seeds import derive_seed


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One success measurement.

    Attributes:
        kind: ``kind`` of its metrics records.
        name: What it is called in logs.
        summary_prefix: Prefix of its ``before_rl``/``after_rl`` keys in ``summary.json``.
        split: The split its tasks come from.
        num_tasks: Tasks spread over the split.
    """

    kind: str
    name: str
    summary_prefix: str
    split: str
    num_tasks: int


def evaluations(config: TrainConfig) -> list[Evaluation]:
    """The evaluations a run makes before and after RL (the held-out one also every ``eval.every``)."""
    out = []
    if config.eval.num_tasks > 0:
        out.append(
            Evaluation(HELD_OUT_EVAL_KIND, "held-out", "", config.env.eval_split, config.eval.num_tasks)
        )
    if config.eval.rl_tasks:
        split, count = config.env.train_split, config.rollout.task_pool
        out.append(Evaluation(RL_TASKS_EVAL_KIND, "RL-task", "rl_tasks_", split, count))
    return out


def evaluation_summary(evaluations: list[Evaluation], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s evaluation entries: each evaluation's success, invalid rate and scores before and
    after RL, under its ``summary_prefix`` + ``before_rl`` / ``after_rl``."""
    summary: dict[str, Any] = {}
    for evaluation in evaluations:
        done = {r["label"]: r for r in records if r["kind"] == evaluation.kind}
        for label in ("before_rl", "after_rl"):
            if label in done:
                summary[evaluation.summary_prefix + label] = {
                    k: v
                    for k, v in done[label].items()
                    if k.startswith("success") or k in ("invalid_rate", "episodes", "score", "task_score")
                }
    return summary


class Evaluator:
    """Plays :class:`Evaluation`\\ s with a generation engine; owns their envs (one copy per task).

    Args:
        config: The run's configuration.
        tokenizer: The policy's tokenizer.
        dist: This process's place in the job (tasks are shared out over ranks).
    """

    def __init__(self, config: TrainConfig, tokenizer, dist: DistContext):
        self.config, self.tokenizer, self.dist = config, tokenizer, dist
        self._workers: dict[str, RolloutWorker] = {}

    def _worker(self, evaluation: Evaluation) -> RolloutWorker:
        if evaluation.kind not in self._workers:
            copies = max(len(self.dist.shard(list(range(evaluation.num_tasks)))), 1)
            envs = make_split_envs(self.config.env, evaluation.split, copies, 1)
            self._workers[evaluation.kind] = RolloutWorker.from_config(envs, self.config, self.tokenizer)
        return self._workers[evaluation.kind]

    def run(
        self, evaluation: Evaluation, engine: GenerationEngine, iteration: int, label: str
    ) -> dict[str, Any]:
        """Play ``evaluation``'s tasks once per ``eval.seeds`` seed; its record (``label``: ``before_rl``,
        ``periodic`` or ``after_rl``)."""
        cfg, kind = self.config.eval, evaluation.kind
        worker = self._worker(evaluation)
        all_tasks = spread_tasks(num_tasks(worker.envs), evaluation.num_tasks)
        tasks = self.dist.shard(all_tasks)
        indices = tasks or [0]  # a rank without a task still steps its env (every rank samples alike)
        first = (len(all_tasks) * self.dist.rank) // self.dist.world_size  # this rank's first task's place
        per_seed, all_episodes, admissible = [], [], [0.0, 0.0]
        for s in range(cfg.seeds):
            result = worker.run(
                seed=derive_seed(self.config.seed, kind, s) % (2**31 - len(indices)),
                task_indices=indices,
                engine=engine,
                temperature=cfg.temperature,
                max_new_tokens=self.config.rollout.max_new_tokens,
                sampling_seed=derive_seed(self.config.seed, kind, s),
                traj_offset=first,
            )
            mine = result.episodes if tasks else []
            if tasks:
                admissible[0] += sum(result.rows.admissible)
                admissible[1] += result.rows.num_rows
            episodes = [e for part in self.dist.gather_objects(mine) for e in part]
            won = [e.won for e in episodes if e.env_error is None]  # a lost env server's are not scored
            per_seed.append(float(np.mean(won)) if won else 0.0)
            all_episodes += episodes
        record: dict[str, Any] = {"kind": kind, "iteration": iteration, "label": label}
        record.update(episode_metrics(all_episodes))
        record["success_std"] = float(np.std(per_seed))
        record["success_per_seed"] = per_seed
        record["admissible_rate"] = self.dist.all_reduce_sum(admissible[0]) / max(
            self.dist.all_reduce_sum(admissible[1]), 1.0
        )
        return record

    def close(self) -> None:
        """Close the evaluation envs."""
        for worker in self._workers.values():
            worker.envs.close()
        self._workers.clear()


class RunEvaluations:
    """A training run's evaluations (:func:`evaluations`), played when the run is at each point, and their
    records: each is written to the metrics log and kept in :attr:`records` (the run's checkpointed
    ``state["evaluations"]``), labelled ``before_rl``, ``periodic`` or ``after_rl``.

    Args:
        config: The run's configuration.
        tokenizer: The policy's tokenizer.
        dist: This process's place in the job.
        metrics: The run's metrics log.
    """

    def __init__(self, config: TrainConfig, tokenizer, dist: DistContext, metrics: MetricsLog):
        self.config, self.dist, self.metrics = config, dist, metrics
        self.planned = evaluations(config)
        self.evaluator = Evaluator(config, tokenizer, dist)
        self.records: list[dict[str, Any]] = []

    def before_rl(self, engine: GenerationEngine) -> None:
        """Every evaluation, before the first RL iteration (with ``eval.before_rl``)."""
        if self.config.eval.before_rl:
            for evaluation in self.planned:
                self.play(evaluation, engine, 0, "before_rl")

    def periodic(self, engine: GenerationEngine, iteration: int) -> None:
        """The held-out evaluation after every ``eval.every``-th iteration but the last (after RL measures
        that one), without log lines."""
        every = self.config.eval.every
        if every and iteration % every == 0 and iteration < self.config.iterations:
            for evaluation in self.planned:
                if evaluation.kind == HELD_OUT_EVAL_KIND:
                    self.play(evaluation, engine, iteration, "periodic", quiet=True)

    def after_rl(self, engine: GenerationEngine, iteration: int, checkpoint: Callable[[], None]) -> None:
        """Every evaluation not yet recorded after RL, each followed by ``checkpoint()``, so that a resumed
        run does not play it again. Without RL iterations the policy is the one measured before RL: that
        record is reused, not played again."""
        for evaluation in self.planned:
            done = {r["label"]: r for r in self.records if r["kind"] == evaluation.kind}
            if "after_rl" in done:
                continue
            if "before_rl" in done and iteration == 0:
                self.record({**done["before_rl"], "label": "after_rl"})
            else:
                self.play(evaluation, engine, iteration, "after_rl")
            checkpoint()

    def play(
        self,
        evaluation: Evaluation,
        engine: GenerationEngine,
        iteration: int,
        label: str,
        quiet: bool = False,
    ) -> dict[str, Any]:
        """Play ``evaluation`` with ``engine`` now (:meth:`Evaluator.run`) and record it; logs its size and
        success unless ``quiet``."""
        when = label.replace("_rl", " RL").replace("_", " ")
        if not quiet:
            seeds = self.config.eval.seeds
            size = f"{evaluation.num_tasks} tasks of {evaluation.split} x {seeds} seed{'s' * (seeds > 1)}"
            self.dist.log(f"{evaluation.name} success {when}: playing {size}")
        record = self.record(self.evaluator.run(evaluation, engine, iteration, label))
        if not quiet:
            self.dist.log(
                f"{evaluation.name} success {when}: {record['success']:.3f} ± {record['success_std']:.3f}"
            )
        return record

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write ``record`` to the metrics log and keep it in :attr:`records`."""
        self.metrics.write(record)
        self.records.append(record)
        return record

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s evaluation entries (:func:`evaluation_summary`) of the records so far."""
        return evaluation_summary(self.planned, self.records)

    def close(self) -> None:
        """Close the evaluation envs."""
        self.evaluator.close()
