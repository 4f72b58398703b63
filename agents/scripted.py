"""Agents without a model: uniform random, the env's expert, and a human at the terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from agents.base import AgentAction, Task, active_mask
from agents.projection import match_admissible
from agents.prompts import admissible_actions_from_info, get_style


def _fill_pattern(action: str, task: Task) -> str:
    """A concrete action for a pattern entry of the task's style: WebShop's ``search[<your query>]`` searches
    the task text."""
    return get_style(task.env_kind).fill(action, task.task_text or "item")


class ScriptedAgent:
    """Base of the agents without a model: each active slot's action is decided on its own
    (:meth:`choose`), ``None`` for the inactive ones."""

    def reset(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)

    def act(
        self,
        observations: Sequence[str],
        infos: Sequence[dict[str, Any]],
        active: Sequence[bool] | None = None,
    ) -> list[AgentAction | None]:
        mask = active_mask(active, len(observations))
        slots = enumerate(zip(observations, infos, mask, strict=True))
        return [self.choose(i, observation, info) if on else None for i, (observation, info, on) in slots]

    def choose(self, slot: int, observation: str, info: dict[str, Any]) -> AgentAction:
        """The action of active slot ``slot``, which plays ``self.tasks[slot]``."""
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release."""


class RandomAgent(ScriptedAgent):
    """Uniform over the admissible actions; each slot draws from its own generator seeded by
    (seed, task index, episode seed), so an episode's actions do not depend on how episodes are batched.

    Args:
        seed: Base seed.
    """

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.tasks: list[Task] = []
        self._rngs: list[np.random.Generator] = []

    def reset(self, tasks: Sequence[Task]) -> None:
        super().reset(tasks)
        self._rngs = [np.random.default_rng([self.seed, t.task_index, t.seed]) for t in self.tasks]

    def choose(self, slot: int, observation: str, info: dict[str, Any]) -> AgentAction:
        pool = admissible_actions_from_info(self.tasks[slot].env_kind, info)
        if not pool:
            return AgentAction("look", admissible=False, raw_output="look")
        action = _fill_pattern(pool[int(self._rngs[slot].integers(len(pool)))], self.tasks[slot])
        return AgentAction(action, admissible=True, raw_output=action)


class ExpertAgent(ScriptedAgent):
    """Plays ``info["expert_action"]`` (the env must be made with ``expert=True``)."""

    def choose(self, slot: int, observation: str, info: dict[str, Any]) -> AgentAction:
        action = info.get("expert_action")
        if not isinstance(action, str) or not action:
            raise RuntimeError(
                "info has no 'expert_action': make the env with expert=True (the expert agent reads it)"
            )
        pool = admissible_actions_from_info(self.tasks[slot].env_kind, info)
        admissible = match_admissible(action, pool) is not None if pool else None
        return AgentAction(action, admissible=admissible, raw_output=action)


class HumanAgent(ScriptedAgent):
    """Asks a person for each action: a number picks a listed admissible action, other text is sent as is.

    Args:
        input_stream: Where answers are read from (the terminal by default).
        output_stream: Where observations and choices are printed.
    """

    def __init__(self, input_stream: TextIO | None = None, output_stream: TextIO | None = None):
        self.input_stream = input_stream or sys.stdin
        self.output_stream = output_stream or sys.stdout
        self.tasks: list[Task] = []

    def _ask(self, prompt: str) -> str:
        self.output_stream.write(prompt)
        self.output_stream.flush()
        line = self.input_stream.readline()
        if not line:
            raise EOFError("no more input for the human agent")
        return line.strip()

    def choose(self, slot: int, observation: str, info: dict[str, Any]) -> AgentAction:
        task = self.tasks[slot]
        pool = admissible_actions_from_info(task.env_kind, info)
        write = self.output_stream.write
        write(f"\n=== env {slot} · task {task.task_index}: {task.task_text}\n{observation}\n")
        for n, action in enumerate(pool, 1):
            write(f"  {n:>3}. {action}\n")
        answer = ""
        while not answer:
            answer = self._ask("action (number or text)> ")
        if answer.isdigit() and 1 <= int(answer) <= len(pool):
            choice = pool[int(answer) - 1]
            style = get_style(task.env_kind)
            if style.is_pattern(choice):  # e.g. WebShop's search[<your query>]: ask for the query
                choice = style.fill(choice, self._ask("search query> "))
            answer = choice
        admissible = match_admissible(answer, pool) is not None if pool else None
        return AgentAction(answer, admissible=admissible, raw_output=answer)
