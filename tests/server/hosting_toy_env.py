"""A small, fast :class:`TextEnv` for the server tests: find the key, then open the door.

Each task is a row of ``rooms`` rooms with the key in one of them; the agent moves ``go left``/``go right``,
``take key`` in the key's room, and ``open door`` in the last room once it holds the key (reward 1,
terminated). Anything else is "Nothing happens." Info carries ``admissible_actions`` (a list), a
``numpy.int64`` position and a tuple, so the server's codec is exercised on more than the base keys.
"""

from __future__ import annotations

import numpy as np

from progpo_envs.core import EngineStep, TaskStart, TextEnv

TOY_ENV_ID = "progpo/ServerToy-v0"
#: Computed, because pytest may import this file as `toy_env` or `tests.server.toy_env` depending on rootdir.
TOY_ENTRY_POINT = f"{__name__}:ToyKeyDoorEnv"


class ToyKeyDoorEnv(TextEnv):
    """Key-and-door corridors; ``num_tasks`` of them, the key in room ``(7 * i) % rooms`` of task ``i``.

    Args:
        num_tasks: Tasks in the split.
        rooms: Rooms per corridor.
        max_steps: Actions per episode.
        history_depths: Window depths for ``info["history_keys"]``.
        crash_on: An action that makes the engine raise (to test the server's handling of env failures).
    """

    def __init__(
        self,
        *,
        num_tasks: int = 16,
        rooms: int = 5,
        max_steps: int = 30,
        history_depths: tuple[int, ...] = (1, 3),
        crash_on: str = "",
        render_mode: str | None = None,
    ):
        super().__init__(max_steps=max_steps, history_depths=history_depths, render_mode=render_mode)
        if num_tasks < 1 or rooms < 2:
            raise ValueError("num_tasks must be >= 1 and rooms >= 2")
        self._num_tasks, self.rooms, self.crash_on = int(num_tasks), int(rooms), crash_on

    @property
    def num_tasks(self) -> int:
        return self._num_tasks

    def _describe(self) -> str:
        where = f"You are in room {self._pos} of {self.rooms}."
        if self._pos == self._key and not self._has_key:
            where += " A key lies on the floor."
        if self._pos == self.rooms - 1:
            where += " There is a locked door here."
        return where

    def _admissible(self) -> list[str]:
        actions = []
        if self._pos > 0:
            actions.append("go left")
        if self._pos < self.rooms - 1:
            actions.append("go right")
        if self._pos == self._key and not self._has_key:
            actions.append("take key")
        if self._pos == self.rooms - 1:
            actions.append("open door")
        return actions + ["look"]

    def _info(self) -> dict:
        return {
            "admissible_actions": self._admissible(),
            "position": np.int64(self._pos),
            "state": (self._pos, self._has_key),
            "won": False,
        }

    def _start_task(self, task_index: int) -> TaskStart:
        self._pos, self._has_key = 0, False
        self._key = (7 * task_index) % self.rooms
        # the seeded RNG varies the intro so that seeds matter beyond the task choice
        mood = ["quiet", "dusty", "bright"][int(self.np_random.integers(3))]
        return TaskStart(
            f"A {mood} corridor. Find the key and open the door. {self._describe()}",
            f"toy-{task_index}",
            self._info(),
        )

    def _engine_step(self, action: str) -> EngineStep:
        if self.crash_on and action == self.crash_on:
            raise RuntimeError("the toy engine crashed on purpose")
        command = action.strip().lower()
        won = False
        if command == "go left" and self._pos > 0:
            self._pos -= 1
            text = self._describe()
        elif command == "go right" and self._pos < self.rooms - 1:
            self._pos += 1
            text = self._describe()
        elif command == "take key" and self._pos == self._key and not self._has_key:
            self._has_key = True
            text = "You take the key."
        elif command == "open door" and self._pos == self.rooms - 1 and self._has_key:
            won = True
            text = "The door opens. You win."
        elif command == "look":
            text = self._describe()
        else:
            text = "Nothing happens."
        info = {**self._info(), "won": won}
        return EngineStep(text, 1.0 if won else 0.0, won, info)

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep("Nothing happens.", 0.0, False, self._info())


def register_toy_env() -> None:
    """Register :data:`TOY_ENV_ID` (idempotent)."""
    from progpo_envs.core import register_text_env

    register_text_env(TOY_ENV_ID, TOY_ENTRY_POINT)


register_toy_env()  # `progpo serve --import toy_env` hosts it
