"""The per-episode rollout loop: every copy plays at its own pace, groups start as slots free up.

:func:`agents.rollout.play_episodes` steps all copies together: each turn waits for the agent's slowest
decision, then for every env. :func:`play_per_episode` has no turn barrier. Each copy asks its
:class:`EpisodeAgent` for a decision as soon as its last env step returned (:meth:`EpisodeAgent.decide`
returns a future), the loop steps the copies whose decisions arrived (together, in one
:meth:`~progpo_envs.core.vector.GroupVectorEnv.step_some`) while the others are still being decided, and a
copy whose episode ended waits for the rest of its group. Groups stay groups: the ``G`` copies of a group are
reset together with one seed and one task (:meth:`~progpo_envs.core.vector.GroupVectorEnv.reset_group`), and
a group's slots take the next group from the :class:`GroupFeed` only when all ``G`` episodes ended.

The loop yields a :class:`GroupTransition` per env step of a copy, in the order the steps happen (which
depends on timing); what each episode sees and does depends only on its own seed, task and decisions. It ends
when the feed is exhausted and every admitted group finished.

Example:
    >>> import gymnasium as gym
    >>> from concurrent.futures import Future
    >>> from agents.base import AgentAction
    >>> from progpo_envs.testing import DRAWER_ENV_ID
    >>> class Expert:  # decides at once, from the env's expert action
    ...     def start(self, slot, task, group): pass
    ...     def decide(self, slot, observation, info):
    ...         future = Future()
    ...         future.set_result(AgentAction(info["expert_action"]))
    ...         return future
    >>> envs = gym.make_vec(DRAWER_ENV_ID, num_envs=2, group_size=2, expert=True)
    >>> feed = ListFeed([GroupStart("g0", seed=0, task_index=0), GroupStart("g1", seed=1, task_index=1)])
    >>> steps = list(play_per_episode(envs, Expert(), "alfworld", feed))
    >>> sorted({(s.group.key, s.copy) for s in steps if s.transition.done})
    [('g0', 0), ('g0', 1), ('g1', 0), ('g1', 1)]
    >>> envs.close()
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Protocol

from agents.base import AgentAction, Task
from agents.prompts import get_style, task_text_from_observation
from agents.rollout import MAX_VECTOR_STEPS, Transition


@dataclasses.dataclass(frozen=True)
class GroupStart:
    """A task group to play: its ``G`` copies are reset with ``seed`` on task ``task_index``.

    Attributes:
        key: The caller's name for the group (carried by each of its transitions).
        seed: The reset seed its copies share.
        task_index: The task (``None``: the seed picks).
    """

    key: Hashable
    seed: int
    task_index: int | None = None


class GroupFeed(Protocol):
    """Where :func:`play_per_episode` takes its groups from (admission control lives here)."""

    def next_group(self, timeout: float) -> GroupStart | None:
        """The next group to start, waiting up to ``timeout`` seconds for one; ``None`` when none is ready."""

    @property
    def exhausted(self) -> bool:
        """Whether no group will come any more (the loop ends when its groups have finished)."""


class ListFeed:
    """A :class:`GroupFeed` over a fixed list of groups, in order.

    Args:
        groups: The groups to play.
    """

    def __init__(self, groups: Sequence[GroupStart]):
        self.groups = deque(groups)

    def next_group(self, timeout: float) -> GroupStart | None:
        """See :class:`GroupFeed` (never waits)."""
        return self.groups.popleft() if self.groups else None

    @property
    def exhausted(self) -> bool:
        """See :class:`GroupFeed`."""
        return not self.groups


class EpisodeAgent(Protocol):
    """An agent that decides for one copy at a time, asynchronously."""

    def start(self, slot: int, task: Task, group: GroupStart) -> None:
        """A new episode of ``task`` starts in env slot ``slot`` (copy ``slot % G`` of ``group``)."""

    def decide(self, slot: int, observation: str, info: dict[str, Any]) -> Future[AgentAction]:
        """Start deciding the next action of the copy in ``slot``; the decision arrives in the future."""


@dataclasses.dataclass
class GroupTransition:
    """One env step of one copy, with its group.

    Attributes:
        group: The group the copy plays.
        copy: The copy's index in its group (``0..G-1``).
        transition: The step (:class:`agents.rollout.Transition`; ``slot`` is the env slot).
        env_seconds: The wall time of the env call that stepped it, shared out over the copies it stepped.
        group_done: Whether this step ended the group's last episode.
    """

    group: GroupStart
    copy: int
    transition: Transition
    env_seconds: float
    group_done: bool


@dataclasses.dataclass
class _Slot:
    """A copy playing its episode."""

    group: GroupStart
    task: Task
    observation: str
    info: dict[str, Any]
    steps: int = 0


def play_per_episode(
    envs,
    agent: EpisodeAgent,
    env_kind: str,
    feed: GroupFeed,
    *,
    poll_s: float = 0.05,
) -> Iterator[GroupTransition]:
    """Play the feed's groups in ``envs``' group slots, every copy at its own pace (module docstring).

    Args:
        envs: A :class:`~progpo_envs.core.vector.GroupVectorEnv`: ``num_groups`` group slots of
            ``group_size`` copies (the groups in flight at most).
        agent: Decides for each copy (:class:`EpisodeAgent`).
        env_kind: The env's prompt style, by name (task parsing and prompts; :mod:`agents.prompts.registry`).
        feed: The groups to play, in order (:class:`GroupFeed`).
        poll_s: Longest wait for the feed while no decision is pending (and between looks at the feed while
            decisions are).

    Raises:
        RuntimeError: When an episode does not end after :data:`agents.rollout.MAX_VECTOR_STEPS` steps.
    """
    kind = get_style(env_kind).name
    group_size = envs.group_size
    free_groups = deque(range(envs.num_groups))
    slots: dict[int, _Slot] = {}
    remaining: dict[int, int] = {}  # group slot -> copies still playing
    pending: dict[Future, int] = {}
    while True:
        while free_groups:  # admission: a free group slot takes the feed's next group
            start = feed.next_group(timeout=0.0 if pending else poll_s)
            if start is None:
                break
            group = free_groups.popleft()
            options = {"task_index": int(start.task_index)} if start.task_index is not None else None
            observations, infos = envs.reset_group(group, seed=int(start.seed), options=options)
            remaining[group] = group_size
            for copy, (observation, info) in enumerate(zip(observations, infos, strict=True)):
                slot = group * group_size + copy
                index = -1 if start.task_index is None else int(start.task_index)
                task = Task(
                    env_kind=kind,
                    task_index=index,
                    task_id=str(info.get("task_id", index if start.task_index is not None else "")),
                    task_text=task_text_from_observation(kind, observation, info),
                    task_type=str(info.get("task_type", "") or ""),
                    seed=int(start.seed),
                )
                slots[slot] = _Slot(start, task, observation, info)
                agent.start(slot, task, start)
                pending[agent.decide(slot, observation, info)] = slot
        if not pending:
            if feed.exhausted and not slots:
                return
            continue  # nothing to step: the feed was waited on above
        done, _ = wait(list(pending), timeout=poll_s, return_when=FIRST_COMPLETED)
        if not done:
            continue
        ready = sorted((pending.pop(future), future) for future in done)
        decisions = [future.result() for _, future in ready]  # an agent's error ends the loop here
        copies = [slot for slot, _ in ready]
        started = time.perf_counter()
        results = envs.step_some(copies, [decision.action for decision in decisions])
        share = (time.perf_counter() - started) / len(copies)
        next_observations, rewards, terminations, truncations, next_infos = results
        for k, (slot, decision) in enumerate(zip(copies, decisions, strict=True)):
            state = slots[slot]
            transition = Transition(
                slot=slot,
                task=state.task,
                step=state.steps,
                observation=state.observation,
                info=state.info,
                decision=decision,
                reward=float(rewards[k]),
                terminated=bool(terminations[k]),
                truncated=bool(truncations[k]),
                next_observation=next_observations[k],
                next_info=next_infos[k],
            )
            state.steps += 1
            state.observation, state.info = next_observations[k], next_infos[k]
            group = slot // group_size
            group_done = False
            if transition.done:
                del slots[slot]
                remaining[group] -= 1
                if remaining[group] == 0:
                    del remaining[group]
                    free_groups.append(group)
                    group_done = True
            elif state.steps >= MAX_VECTOR_STEPS:
                raise RuntimeError(
                    f"an episode did not end after {MAX_VECTOR_STEPS} steps; "
                    "does the env truncate at max_steps?"
                )
            else:
                pending[agent.decide(slot, state.observation, state.info)] = slot
            yield GroupTransition(state.group, slot % group_size, transition, share, group_done)
