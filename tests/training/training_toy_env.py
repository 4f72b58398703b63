"""A tiny ALFWorld-styled text env for training tests (milliseconds per step, learnable by a tiny model).

Task ``k`` of 8: "Your task is to: put the key in drawer {d}." Solved by two commands: ``take key 1`` then
``move key 1 to drawer {d}``; any other admissible command answers "Nothing happens." (the ALFWorld
convention). Registered as ``progpo-test/ToyALFWorld-v0`` when imported; make it from a fresh process with the
id ``training_toy_env:progpo-test/ToyALFWorld-v0`` (Gymnasium imports the module first).

With ``noisy_expert=True`` the expert's ``move`` names a random drawer, so imitating it wins only about half
the episodes (two tries of four drawers) and RL has to learn to read the drawer from the task.
"""

from __future__ import annotations

from progpo_envs.core.registration import register_text_env
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

NUM_DRAWERS = 4
ENV_ID = "progpo-test/ToyALFWorld-v0"


class ToyEnv(TextEnv):
    """Take the key, then put it in the drawer the task names (see the module docstring)."""

    def __init__(
        self,
        split: str = "train",
        max_steps: int = 4,
        expert: bool = False,
        history_depths=(),
        noisy_expert: bool = False,
        **_: object,
    ):
        super().__init__(max_steps=max_steps, history_depths=history_depths)
        self.split = split
        self.expert = expert
        self.noisy_expert = noisy_expert  # the expert names a random drawer: imitation alone wins ~1 in 4
        # train: tasks 0..7; valid_seen: the same drawers in a different order (held-out task ids)
        self._targets = [1 + (k % NUM_DRAWERS) for k in range(8)]
        if split != "train":
            self._targets = self._targets[::-1]
        self._target = 1
        self._holding = False

    @property
    def num_tasks(self) -> int:
        return len(self._targets)

    def _admissible(self) -> list[str]:
        base = ["look", "inventory"] + [f"open drawer {d}" for d in range(1, NUM_DRAWERS + 1)]
        if self._holding:
            return base + [f"move key 1 to drawer {d}" for d in range(1, NUM_DRAWERS + 1)]
        return base + ["take key 1"]

    def _info(self, won: bool = False) -> dict:
        info = {"admissible_actions": self._admissible(), "won": won, "task_type": "pick_and_place_simple"}
        if self.expert:
            drawer = int(self.np_random.integers(1, NUM_DRAWERS + 1)) if self.noisy_expert else self._target
            info["expert_action"] = f"move key 1 to drawer {drawer}" if self._holding else "take key 1"
        return info

    def _start_task(self, task_index: int) -> TaskStart:
        self._target = self._targets[task_index]
        self._holding = False
        obs = (
            f"-= Welcome to TextWorld, ALFRED! =-\n\nYou are in a room. You see a key 1 and "
            f"{NUM_DRAWERS} drawers.\n\nYour task is to: put the key in drawer {self._target}."
        )
        return TaskStart(obs, f"{self.split}-{task_index}", self._info())

    def _engine_step(self, action: str) -> EngineStep:
        action = action.strip().lower()
        if action == "take key 1" and not self._holding:
            self._holding = True
            return EngineStep("You pick up the key 1.", 0.0, False, self._info())
        if self._holding and action == f"move key 1 to drawer {self._target}":
            return EngineStep(
                f"You move the key 1 to the drawer {self._target}.", 10.0, True, self._info(True)
            )
        if self._holding and action.startswith("move key 1 to drawer"):
            self._holding = False
            return EngineStep(
                "You put the key in the wrong drawer. You take it back out and drop it.",
                0.0,
                False,
                self._info(),
            )
        return self._invalid_action_step()

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep("Nothing happens.", 0.0, False, self._info())


register_text_env(ENV_ID, "training_toy_env:ToyEnv")
