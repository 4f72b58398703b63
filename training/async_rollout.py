"""Asynchronous rollouts (``rollout.mode=async``): every episode at its own pace, groups admitted whole, and
rollouts overlapping the update within ``rollout.max_staleness`` policy versions.

The pieces:

* :class:`EpisodePolicyAgent` — the training policy as an :class:`agents.per_episode.EpisodeAgent`: a copy's
  prompt is built as soon as its env step returns (:meth:`training.rollout.RolloutWorker.ask`, the lock-step
  prompt) and submitted alone to the :class:`~training.engine_loop.EngineLoop`, which decodes it in one
  continuously batched engine with every other episode's; the response is projected as in lock step
  (:meth:`~training.rollout.RolloutWorker.answer`). Response ``t`` of trajectory ``j`` is drawn from
  :func:`training.seeds.request_seed` ``(round's sampling seed, j, t)``, the lock-step agent's seed for it.
* :class:`AsyncRollout` — a thread that plays the harness's per-episode loop
  (:func:`agents.per_episode.play_per_episode`) over ``(max_staleness + 1) × num_groups`` group slots
  (this rank's share), fed with the iterations' groups in order (:func:`training.rollout.plan_round`: the
  lock-step batches' tasks, seeds and ids), and collects each finished group's rows.

Admission by group, bounded staleness. The groups of iteration ``k``'s batch are admitted — reset and started,
all ``G`` copies at once — only while the sampler's policy version ``v`` (updates applied to it) satisfies
``k ≤ v + max_staleness``: with 0, batch ``k + 1`` starts after update ``k`` has been synced, today's
on-policy loop; with 1, it rolls out while update ``k`` runs (SkyRL's bound on groups in flight,
``(S + 1)·B``, in whole batches). Iteration ``k`` trains on batch ``k``'s groups, whole and in task order
(never on whichever finished first, which would favour short episodes), so no admitted group is ever too
stale to use: a row's staleness ``k − v_row`` is at most ``max_staleness`` by construction, and a group
found older is an error, not a silent drop. Each row keeps its behaviour log-probs and the version that
sampled it (the :class:`~training.engine_loop.EngineLoop` drains before a weight sync, so a response never
mixes two policies); the update corrects stale rows with decoupled PPO (:func:`training.update.ppo_update`).

Same numbers when asked. With ``max_staleness = 0`` and a deterministic engine (the transformers engine on
CPU) the batch equals the lock-step one: same groups, tasks, seeds and responses (each response depends on
its prompt and seed only: :mod:`training.decoding`), rows put in the lock-step order (round, step,
trajectory), the same dynamic-sampling rounds; ``tests/training/test_async_rollout.py`` checks a training run
against ``rollout.mode=lockstep``.

Example:
    >>> from training.config import load_config
    >>> cfg = load_config(None, ["rollout.mode=async", "rollout.max_staleness=1"])
    >>> group_slots(cfg, groups_here=4)  # batch k and k + 1 in flight together
    8
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from agents.base import Task
from agents.envs import num_tasks
from agents.memory import History
from agents.per_episode import GroupStart, play_per_episode
from training.config import TrainConfig
from training.distributed import DistContext
from training.engine_loop import EngineLoop
from training.envs import make_split_envs
from training.rollout import (
    PlannedGroup,
    PolicyAction,
    RolloutRecorder,
    RolloutResult,
    RolloutWorker,
    StepRows,
    gather_rounds,
    plan_round,
)
from training.sampling import SampleRequest
from training.seeds import request_seed


def group_slots(config: TrainConfig, groups_here: int) -> int:
    """Group slots of the per-episode env: this rank's ``groups_here`` groups for each of the
    ``max_staleness + 1`` batches that may be in flight together."""
    return groups_here * (config.rollout.max_staleness + 1)


class EpisodePolicyAgent:
    """The training policy deciding for one copy at a time (module docstring).

    Args:
        worker: The prompt settings (:class:`~training.rollout.RolloutWorker`).
        loop: The engine loop its requests go to.
        temperature: Sampling temperature.
        max_new_tokens: Response length limit.
    """

    def __init__(self, worker: RolloutWorker, loop: EngineLoop, temperature: float, max_new_tokens: int):
        self.worker, self.loop = worker, loop
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self._histories: dict[int, History] = {}
        self._seeds: dict[int, tuple[int, int]] = {}  # slot -> (sampling seed, trajectory id)

    def start(self, slot: int, task: Task, group: GroupStart) -> None:
        """A new episode in ``slot``: a fresh history, and the trajectory id of its copy in its group."""
        planned: PlannedGroup = group.key
        group_size = self.worker.envs.group_size
        self._histories[slot] = History(task_text=task.task_text)
        self._seeds[slot] = (planned.sampling_seed, planned.group_id * group_size + slot % group_size)

    def decide(self, slot: int, observation: str, info: dict[str, Any]) -> Future[PolicyAction]:
        """Submit the copy's prompt; its decision arrives when the engine has sampled the response."""
        worker, history = self.worker, self._histories[slot]
        question = worker.ask(history, observation, info)
        sampling_seed, traj_id = self._seeds[slot]
        request = SampleRequest(
            question.prompt_ids,
            seed=request_seed(sampling_seed, traj_id, history.num_steps),
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            candidates=question.choices if worker.constrained_actions else None,
        )
        decision: Future[PolicyAction] = Future()

        def answer(sampled: Future) -> None:  # in the engine's thread, as soon as the response is done
            try:
                result = sampled.result()
                text = worker.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                decision.set_result(
                    worker.answer(
                        history,
                        observation,
                        question,
                        text,
                        result.token_ids,
                        result.logprobs,
                        result.policy_version,
                    )
                )
            except BaseException as error:  # the loop raises it where it waits
                decision.set_exception(error)

        self.loop.submit(request).add_done_callback(answer)
        return decision


@dataclasses.dataclass
class _GroupRecord:
    """The rows of one group being played, and when it started and ended."""

    planned: PlannedGroup
    recorder: RolloutRecorder = dataclasses.field(default_factory=RolloutRecorder)
    started: float = 0.0
    ended: float | None = None


class AsyncRollout:
    """Plays the iterations' groups per episode in a thread of its own; :meth:`collect` hands iteration
    ``k``'s batch to the trainer (module docstring).

    Args:
        config: The run's configuration (``rollout.mode=async``).
        tokenizer: The policy's tokenizer.
        loop: The engine loop (the trainer's engine) the episodes' requests go to.
        dist: This process's place in the job (each rank plays its own groups).
        version: The sampler's policy version now (the iteration about to be trained).
    """

    def __init__(self, config: TrainConfig, tokenizer, loop: EngineLoop, dist: DistContext, version: int):
        cfg = config.rollout
        self.config, self.loop, self.dist = config, loop, dist
        groups_here = max(len(dist.shard(list(range(cfg.num_groups)))), 1)
        self.envs = make_split_envs(
            config.env, config.env.train_split, group_slots(config, groups_here), cfg.group_size
        )
        self.worker = RolloutWorker.from_config(self.envs, config, tokenizer)
        self.split_size = num_tasks(self.envs)
        self.agent = EpisodePolicyAgent(self.worker, loop, cfg.temperature, cfg.max_new_tokens)
        self._cond = threading.Condition()
        self._queue: list[PlannedGroup] = []  # planned, not yet admitted, in (iteration, round, group) order
        self._planned: set[tuple[int, int]] = set()
        self._groups: dict[tuple[int, int, int], _GroupRecord] = {}  # (iteration, round, group id) -> record
        self._version = version
        self._closed = False
        self._error: BaseException | None = None
        for iteration in range(version, version + cfg.max_staleness + 1):
            self._plan(iteration, 0)
        self._thread = threading.Thread(target=self._play, name="async-rollout", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the trainer's side
    def advance(self, version: int) -> None:
        """The sampler now holds policy ``version``: admit the batches up to ``version + max_staleness``."""
        with self._cond:
            self._version = version
            for iteration in range(version, version + self.config.rollout.max_staleness + 1):
                self._plan(iteration, 0)
            self._cond.notify_all()

    def collect(self, iteration: int) -> RolloutResult:
        """Iteration ``iteration``'s batch, every round of dynamic sampling
        (:func:`training.rollout.gather_rounds`), each round's groups whole and in the lock-step order; waits
        for groups still playing."""
        return gather_rounds(self.config, self.dist, lambda round_index: self._round(iteration, round_index))

    def close(self) -> None:
        """Stop admitting, let the thread end (the engine loop's owner closes it) and close the envs."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=120)
        self.envs.close()

    # ------------------------------------------------------------------ the feed (the rollout thread's side)
    def next_group(self, timeout: float) -> GroupStart | None:
        """The next planned group the staleness bound admits (:class:`agents.per_episode.GroupFeed`)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                if (
                    self._queue
                    and self._queue[0].iteration <= self._version + self.config.rollout.max_staleness
                ):
                    planned = self._queue.pop(0)
                    record = self._groups[(planned.iteration, planned.round, planned.group_id)]
                    record.started = time.perf_counter()
                    return GroupStart(key=planned, seed=planned.reset_seed, task_index=planned.task_index)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    @property
    def exhausted(self) -> bool:
        """Only when closed: the trainer plans more batches as it goes."""
        return self._closed

    # ------------------------------------------------------------------ internals
    def _plan(self, iteration: int, round_index: int) -> None:
        """Queue a round's groups (once: a round stays in ``_planned`` after it was collected), keeping the
        queue in (iteration, round, group) order."""
        if (iteration, round_index) in self._planned or iteration >= self.config.iterations:
            return
        self._planned.add((iteration, round_index))
        groups = plan_round(self.config, iteration, round_index, self.split_size, self.dist)
        for planned in groups:
            self._groups[(iteration, round_index, planned.group_id)] = _GroupRecord(planned)
        self._queue = sorted(self._queue + groups, key=lambda g: (g.iteration, g.round, g.group_id))

    def _play(self) -> None:
        group_size = self.envs.group_size
        try:
            for step in play_per_episode(self.envs, self.agent, self.worker.env_kind, self, poll_s=0.05):
                planned: PlannedGroup = step.group.key
                with self._cond:
                    record = self._groups[(planned.iteration, planned.round, planned.group_id)]
                record.recorder.add(
                    step.transition, planned.group_id, planned.group_id * group_size + step.copy
                )
                record.recorder.result.env_seconds += step.env_seconds
                if step.group_done:
                    with self._cond:
                        record.ended = time.perf_counter()
                        self._cond.notify_all()
        except BaseException as error:  # the trainer raises it where it waits
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _round(self, iteration: int, round_index: int) -> RolloutResult:
        """Wait for the round's groups (planning it first: a dynamic-sampling round asked for now) and put
        their rows in the lock-step order."""
        with self._cond:
            if (iteration, round_index) not in self._planned:  # a dynamic-sampling round asked for now
                self._plan(iteration, round_index)
                self._cond.notify_all()
            keys = sorted(k for k in self._groups if k[:2] == (iteration, round_index))
            while not all(self._groups[k].ended is not None for k in keys):
                if self._error is not None:
                    raise RuntimeError("the asynchronous rollout stopped") from self._error
                self._cond.wait(1.0)
            records = [self._groups.pop(k) for k in keys]
        oldest = iteration - self.config.rollout.max_staleness
        for record in records:
            versions = record.recorder.result.rows.policy_version
            if versions and min(versions) < oldest:  # admission by version makes this impossible
                raise RuntimeError(
                    f"group {record.planned.group_id} of iteration {iteration} was sampled by policy "
                    f"{min(versions)}, more than rollout.max_staleness={self.config.rollout.max_staleness} "
                    "versions behind"
                )
        return _lockstep_order(records)


def _lockstep_order(records: list[_GroupRecord]) -> RolloutResult:
    """One round's groups as the lock-step rollout lays them out: rows by (step, trajectory), episodes by
    trajectory; counters summed, its span from the first group's start to the last one's end."""
    parts = [r.recorder.result for r in records]
    rows = StepRows.empty()
    for part in parts:
        rows.extend(part.rows)
    order = np.lexsort((np.asarray(rows.traj_id), np.asarray(rows.step))) if rows.num_rows else []
    result = RolloutResult(
        rows.select([int(i) for i in order]),
        sorted((e for part in parts for e in part.episodes), key=lambda e: e.traj_id),
    )
    for part in parts:
        result.generated_tokens += part.generated_tokens
        result.prompt_tokens += part.prompt_tokens
        result.env_steps += part.env_steps
        result.env_seconds += part.env_seconds
    if records:
        result.sample_seconds = max(r.ended for r in records) - min(r.started for r in records)
    return result
