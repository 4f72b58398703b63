"""Fixtures of the benchmark tests: a tiny corridor TextEnv with an expert and an exact distance oracle."""

from __future__ import annotations

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load, as in the benchmarks)

# isort: split

import pytest

from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv


class CorridorEnv(TextEnv):
    """Task ``i``: walk from cell 0 to cell ``length_i`` (``forward`` / ``back`` / ``wait``); reward 10 on
    arrival.

    The expert always says ``forward``; ``distance()`` is the exact remaining plan length ``length - cell``.
    """

    LENGTHS = (2, 3, 4)

    def __init__(self, max_steps: int = 8):
        super().__init__(max_steps=max_steps)
        self._cell = 0
        self._goal = 0

    @property
    def num_tasks(self) -> int:
        return len(self.LENGTHS)

    def distance(self) -> int:
        return self._goal - self._cell

    def _info(self) -> dict:
        return {
            "admissible_actions": ["back", "forward", "wait"],
            "expert_action": "forward",
            "won": self._cell == self._goal,
        }

    def _start_task(self, task_index: int) -> TaskStart:
        self._goal, self._cell = self.LENGTHS[task_index], 0
        return TaskStart(
            observation=f"corridor of {self._goal}: at cell 0", task_id=f"c{task_index}", info=self._info()
        )

    def _engine_step(self, action: str) -> EngineStep:
        if action == "forward":
            self._cell += 1
        elif action == "back":
            self._cell = max(0, self._cell - 1)
        elif action != "wait":
            return self._invalid_action_step()
        won = self._cell == self._goal
        return EngineStep(f"at cell {self._cell}", 10.0 if won else 0.0, won, self._info())

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep("Nothing happens.", 0.0, False, self._info())


@pytest.fixture
def corridor_env():
    env = CorridorEnv()
    yield env
    env.close()
