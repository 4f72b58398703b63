"""A tiny :class:`~progpo_envs.core.text_env.TextEnv` for testing the core without a real engine.

Task ``i`` asks the agent to say ``"inc"`` until a counter reaches ``target = i + 2``; ``"inc"`` adds one,
``"dec"`` subtracts one, anything else answers ``"Nothing happens."``. Reaching the target wins (reward 1,
terminated). The env counts how often its engine is stepped, so tests can check that ended episodes do not
touch it.
"""

from __future__ import annotations

from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

NUM_TASKS = 5


class ToyEnv(TextEnv):
    """Counter game; see the module docstring."""

    def __init__(self, max_steps: int = 8, history_depths=(), num_tasks: int = NUM_TASKS, render_mode=None):
        super().__init__(max_steps=max_steps, history_depths=history_depths, render_mode=render_mode)
        self._num_tasks = num_tasks
        self.engine_steps = 0
        self.invalid_steps = 0
        self.count = 0
        self.target = 0

    @property
    def num_tasks(self) -> int:
        return self._num_tasks

    def _start_task(self, task_index: int) -> TaskStart:
        self.count, self.target = 0, task_index + 2
        return TaskStart(
            observation=f"Count to {self.target}. The counter is at 0.",
            task_id=f"count-{self.target}",
            info={"target": self.target},
        )

    def _engine_step(self, action: str) -> EngineStep:
        self.engine_steps += 1
        if action == "inc":
            self.count += 1
        elif action == "dec":
            self.count -= 1
        else:
            return EngineStep("Nothing happens.", 0.0, False, {"target": self.target})
        won = self.count == self.target
        return EngineStep(
            f"The counter is at {self.count}.", 1.0 if won else 0.0, won, {"target": self.target}
        )

    def _invalid_action_step(self) -> EngineStep:
        self.invalid_steps += 1
        return EngineStep("Nothing happens.", 0.0, False, {"target": self.target})
