"""A new env as a contributor adds one (docs/adding_an_environment.md): this module and its registration only.

``progpo/Guess-v0``: guess a secret number from 1 to 8; each wrong guess is answered "higher" or "lower".
Nothing in the project names it: the harness, the env server and the trainer learn everything from the env
itself (its ``metadata``, ``split_names``, ``info``). Played as
``tests.progpo_envs.new_env.guess_env:progpo/Guess-v0`` (Gymnasium imports this module first), or hosted with
``progpo serve --import tests.progpo_envs.new_env.guess_env --env progpo/Guess-v0`` (the repository root on
``PYTHONPATH``; a contributor's own module is named as it is imported, e.g. ``guess_env``).

Its prompt style is its own, registered here by name: it is the generic ``text`` style with a role line
about the game (an env module that may not import ``agents`` names the ``text`` style, or none, instead).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agents.prompts import get_style, register_style
from progpo_envs.core.registration import register_text_env
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

GUESS_ENV_ID = "progpo/Guess-v0"
HIGHEST = 8

register_style(
    dataclasses.replace(get_style("text"), name="guess", role="You are playing a number-guessing game.")
)


class GuessEnv(TextEnv):
    """Task ``i`` of a split: find its secret number with ``guess N`` actions (reward 1 for the right one).

    Args:
        split: ``train`` (secrets ``1 + (3 i) % 8``) or ``test`` (the same in reverse order).
        max_steps: Guesses per episode (binary search needs 4 at most).
        expert: Put the binary-search guess in ``info["expert_action"]``.
        history_depths: Window depths of ``info["history_keys"]``.
    """

    metadata = {**TextEnv.metadata, "prompt_style": "guess"}

    @classmethod
    def split_names(cls, **_: Any) -> tuple[str, ...]:
        return ("train", "test")

    def __init__(
        self,
        split: str = "train",
        max_steps: int = 6,
        expert: bool = False,
        history_depths: Sequence[int] = (),
        render_mode: str | None = None,
    ):
        if split not in self.split_names():
            raise ValueError(f"split {split!r} is not one of {self.split_names()}")
        super().__init__(max_steps=max_steps, history_depths=history_depths, render_mode=render_mode)
        secrets = [1 + (3 * i) % HIGHEST for i in range(HIGHEST)]
        self.split, self.expert = split, expert
        self._secrets = secrets if split == "train" else secrets[::-1]

    @property
    def num_tasks(self) -> int:
        return len(self._secrets)

    def _info(self, won: bool = False) -> dict[str, Any]:
        info = {
            "admissible_actions": [f"guess {n}" for n in range(self._low, self._high + 1)],
            "won": won,
            "task_type": "low" if self._secret <= HIGHEST // 2 else "high",
            "task_score": float(won),
        }
        if self.expert:
            info["expert_action"] = None if won else f"guess {(self._low + self._high) // 2}"
        return info

    def _start_task(self, task_index: int) -> TaskStart:
        self._secret, self._low, self._high = self._secrets[task_index], 1, HIGHEST
        observation = f"I am thinking of a number from 1 to {HIGHEST}. Guess it."
        return TaskStart(observation, f"{self.split}-{task_index}", self._info())

    def _engine_step(self, action: str) -> EngineStep:
        word, _, number = action.partition(" ")
        if word != "guess" or not number.isdigit():
            return self._invalid_action_step()
        guess = int(number)
        if guess == self._secret:
            return EngineStep(f"Yes, it is {guess}.", 1.0, True, self._info(won=True))
        if guess < self._secret:
            self._low = max(self._low, guess + 1)
            return EngineStep(f"{guess} is too low.", 0.0, False, self._info())
        self._high = min(self._high, guess - 1)
        return EngineStep(f"{guess} is too high.", 0.0, False, self._info())

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep(f"Say 'guess N' with N from 1 to {HIGHEST}.", 0.0, False, self._info())


register_text_env(GUESS_ENV_ID, f"{__name__}:GuessEnv")
