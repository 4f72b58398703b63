"""The rollout loop: an agent plays one episode in every copy of a vector env, step by step, to the end.

Evaluation (:func:`agents.evaluate.evaluate`), the training rollouts (:class:`training.rollout.RolloutWorker`)
and the policy-rollout recorder all play through :func:`play_episodes`; they differ in the agent (an
:class:`~agents.base.Agent`), not in the loop. One call resets the copies with one task index per group,
tells the agent each copy's :class:`~agents.base.Task`, then repeats: the agent acts for the copies still
playing, the vector env steps every copy (copies whose episode ended get ``""``; the env latches their final
step), and the step's :class:`Transition` of every playing copy is yielded, in copy order, as one
:class:`VectorStep`. A copy stops playing when its episode terminates or is truncated, or when the agent
could not decide for it (a decision with ``error``, e.g. its LLM request failed): that copy is not stepped
further and its :class:`AgentFailure` comes in the step's ``failures``, so one failed request ends one
episode, not the loop.

Infos reach the agent and the caller as one plain dict per copy
(:func:`progpo_envs.core.vector.reset_per_copy`, :func:`~progpo_envs.core.vector.step_per_copy`).

Example:
    >>> import gymnasium as gym
    >>> from agents.scripted import ExpertAgent
    >>> from progpo_envs.testing import DRAWER_ENV_ID
    >>> envs = gym.make_vec(DRAWER_ENV_ID, num_envs=2, expert=True)
    >>> steps = list(play_episodes(envs, ExpertAgent(), "alfworld", seed=0, task_indices=[0, 1]))
    >>> [(t.slot, t.step, t.decision.action) for t in steps[1].transitions]
    [(0, 1, 'move key 1 to drawer 1'), (1, 1, 'move key 1 to drawer 2')]
    >>> [t.next_info["won"] for t in steps[-1].transitions if t.done]
    [True, True]
    >>> envs.close()
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from agents.base import Agent, AgentAction, Task
from agents.prompts import get_style, task_text_from_observation
from progpo_envs.core.vector import reset_per_copy, step_per_copy

#: Vector steps after which a loop gives up: a guard against an env that never ends an episode (TextEnv
#: truncates at ``max_steps``).
MAX_VECTOR_STEPS = 100_000


@dataclasses.dataclass
class Transition:
    """One copy's step: what it saw, what the agent decided, and what the env answered.

    Attributes:
        slot: The copy's index in the vector env.
        task: The task the copy plays (as the agent was told at reset).
        step: Steps the copy had taken before this one.
        observation, info: What the agent acted on.
        decision: The agent's decision (``decision.action`` was played).
        reward, terminated, truncated: The env's answer.
        next_observation, next_info: What the step led to.
    """

    slot: int
    task: Task
    step: int
    observation: str
    info: dict[str, Any]
    decision: AgentAction
    reward: float
    terminated: bool
    truncated: bool
    next_observation: str
    next_info: dict[str, Any]

    @property
    def done(self) -> bool:
        """Whether the copy's episode ended with this step."""
        return self.terminated or self.truncated


@dataclasses.dataclass
class AgentFailure:
    """A copy whose episode ended because the agent could not decide (see :attr:`AgentAction.error`).

    Attributes:
        slot, task: The copy and its task.
        step: Steps the copy had taken.
        observation, info: What the agent was to act on.
        error: The agent's error message.
    """

    slot: int
    task: Task
    step: int
    observation: str
    info: dict[str, Any]
    error: str


@dataclasses.dataclass
class VectorStep:
    """One step of the vector env: the transitions of the copies that played it, the env's time, and the
    copies whose episode the agent's failure ended at this step (not stepped)."""

    transitions: list[Transition]
    env_seconds: float
    failures: list[AgentFailure] = dataclasses.field(default_factory=list)


def play_episodes(
    envs: gym.vector.VectorEnv,
    agent: Agent,
    env_kind: str,
    *,
    seed: int | Sequence[int],
    task_indices: Sequence[int] | None = None,
    playing: Sequence[bool] | None = None,
) -> Iterator[VectorStep]:
    """Play one episode per copy of ``envs`` with ``agent``; yields each vector step's transitions.

    Args:
        envs: ``num_envs`` copies in groups of ``group_size`` (other vector envs: groups of 1).
        agent: Decides for every playing copy at each step.
        env_kind: The env's prompt style, by name (task parsing and prompts; :mod:`agents.prompts.registry`).
        seed: Reset seed: group ``b`` is reset with ``seed + b``, or ``seed[b]`` when a sequence (its copies
            share it), which is each copy's :attr:`Task.seed`.
        task_indices: One task index per group (``None``: the seed picks; :attr:`Task.task_index` is -1).
        playing: Which copies play (default all); the others only fill the batch and are never reported.

    Raises:
        RuntimeError: When the agent returns no decision for a playing copy, or episodes do not end.
    """
    kind = get_style(env_kind).name
    num_envs = envs.num_envs
    group_size = getattr(envs, "group_size", 1)
    options = {"task_indices": list(task_indices)} if task_indices is not None else None
    group_seeds = [int(s) for s in seed] if isinstance(seed, Sequence) else None
    observations, infos = reset_per_copy(envs, seed=group_seeds or seed, options=options)
    indices = [
        int(task_indices[i // group_size]) if task_indices is not None else -1 for i in range(num_envs)
    ]
    tasks = [
        Task(
            env_kind=kind,
            task_index=indices[i],
            task_id=str(infos[i].get("task_id", indices[i] if task_indices is not None else "")),
            task_text=task_text_from_observation(kind, observations[i], infos[i]),
            task_type=str(infos[i].get("task_type", "") or ""),
            seed=group_seeds[i // group_size] if group_seeds else seed + i // group_size,
        )
        for i in range(num_envs)
    ]
    agent.reset(tasks)
    active = [True] * num_envs if playing is None else [bool(p) for p in playing]
    steps_taken = [0] * num_envs
    for _ in range(MAX_VECTOR_STEPS):
        if not any(active):
            return
        decisions = agent.act(observations, infos, active)
        failures = []
        for i in range(num_envs):
            if active[i] and decisions[i] is None:
                raise RuntimeError(f"the agent returned no action for active env slot {i}")
            if active[i] and decisions[i].error is not None:
                failures.append(
                    AgentFailure(i, tasks[i], steps_taken[i], observations[i], infos[i], decisions[i].error)
                )
                active[i] = False  # its episode ends here; the copy only fills the batch from now on
        if not any(active):  # nothing left to step
            yield VectorStep([], 0.0, failures)
            return
        actions = [d.action if on else "" for d, on in zip(decisions, active, strict=True)]
        started = time.perf_counter()
        next_observations, reward_array, terminated_array, truncated_array, next_infos = step_per_copy(
            envs, actions
        )
        env_seconds = time.perf_counter() - started
        # plain Python values: indexing a list is several times cheaper than indexing an array per slot
        rewards = np.asarray(reward_array).tolist()
        terminations = np.asarray(terminated_array).tolist()
        truncations = np.asarray(truncated_array).tolist()
        transitions = []
        for i in range(num_envs):
            if not active[i]:
                continue
            transitions.append(
                Transition(
                    slot=i,
                    task=tasks[i],
                    step=steps_taken[i],
                    observation=observations[i],
                    info=infos[i],
                    decision=decisions[i],
                    reward=float(rewards[i]),
                    terminated=bool(terminations[i]),
                    truncated=bool(truncations[i]),
                    next_observation=next_observations[i],
                    next_info=next_infos[i],
                )
            )
            steps_taken[i] += 1
            if terminations[i] or truncations[i]:
                active[i] = False
        yield VectorStep(transitions, env_seconds, failures)
        observations, infos = next_observations, next_infos
    if any(active):
        raise RuntimeError(
            f"episodes did not end after {MAX_VECTOR_STEPS} steps; does the env truncate at max_steps?"
        )
