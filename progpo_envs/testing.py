"""Toy text envs for tests: engine-free games that keep the text-env contract, made by id from any process.

Like Gymnasium's toy-text envs they need no data and step in microseconds, so tests of the base env, the
vector env, the env server, the agent harness and the training loop run on them instead of on a real engine.
All are :class:`ToyTextEnv` games (``num_tasks`` tasks; ``task_index``/seed choice, history keys, latching and
truncation come from :class:`~progpo_envs.core.text_env.TextEnv`). Importing this module registers:

* ``progpo-test/Counter-v0`` — :class:`CounterEnv`: say ``inc`` until a counter reaches the target;
* ``progpo/ServerToy-v0`` — :class:`KeyDoorEnv`: find the key, open the door (infos with numpy values and
  tuples for the server's codec; in the ``progpo/`` namespace, so an env server may host it:
  ``progpo serve --import progpo_envs.testing --env progpo/ServerToy-v0``);
* ``agents-test/ToyALFWorld-v0`` and ``agents-test/ToyWebShop-v0`` — :class:`ToyALFWorldEnv` and
  :class:`ToyWebShopEnv`, shaped like the real envs' infos (admissible actions, task types, scores, expert
  actions), each observation saying what the expert would do next, and played in the real envs' prompt
  styles (``metadata["prompt_style"]``);
* ``progpo-test/ToyALFWorld-v0`` — :class:`DrawerEnv`: take the key, put it in the drawer the task names (a
  task a tiny policy can learn; ALFWorld's prompt style).

The counter and the key-and-door games name no prompt style: agents show them in the generic ``text`` one.

The module is only imported by tests (``import progpo_envs`` does not register these ids).

Example:
    >>> import gymnasium as gym
    >>> import progpo_envs.testing
    >>> env = gym.make(progpo_envs.testing.COUNTER_ENV_ID)
    >>> env.reset(options={"task_index": 0})[0]
    'Count to 2. The counter is at 0.'
    >>> env.step("inc")[:3]
    ('The counter is at 1.', 0.0, False)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from progpo_envs.alfworld.task_types import TASK_TYPES
from progpo_envs.core.registration import register_text_env
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

COUNTER_ENV_ID = "progpo-test/Counter-v0"
KEY_DOOR_ENV_ID = "progpo/ServerToy-v0"
TOY_ALFWORLD_ENV_ID = "agents-test/ToyALFWorld-v0"
TOY_WEBSHOP_ENV_ID = "agents-test/ToyWebShop-v0"
DRAWER_ENV_ID = "progpo-test/ToyALFWorld-v0"

NOTHING_HAPPENS = "Nothing happens."


class ToyTextEnv(TextEnv):
    """A toy game of ``num_tasks`` tasks; the games below say what a task is and what an action does.

    Args:
        num_tasks: Tasks in the split.
        max_steps: Actions per episode.
        history_depths: Window depths for ``info["history_keys"]``.
        render_mode: ``"ansi"`` or ``None``.
    """

    def __init__(
        self,
        *,
        num_tasks: int,
        max_steps: int,
        history_depths: Sequence[int] = (),
        render_mode: str | None = None,
    ):
        super().__init__(max_steps=max_steps, history_depths=history_depths, render_mode=render_mode)
        self._num_tasks = num_tasks

    @property
    def num_tasks(self) -> int:
        return self._num_tasks


class CounterEnv(ToyTextEnv):
    """Task ``i``: say ``"inc"`` until a counter reaches ``target = i + 2``.

    ``"inc"`` adds one, ``"dec"`` subtracts one (the admissible actions), anything else answers "Nothing
    happens.". Reaching the target wins (reward 1, terminated). The env counts how often its engine is
    stepped (``engine_steps``) and how many actions were malformed (``invalid_steps``), so tests can check
    that ended episodes do not touch it.
    """

    #: Tasks by default.
    NUM_TASKS = 5

    def __init__(self, max_steps: int = 8, history_depths=(), num_tasks: int = NUM_TASKS, render_mode=None):
        super().__init__(
            num_tasks=num_tasks, max_steps=max_steps, history_depths=history_depths, render_mode=render_mode
        )
        self.engine_steps = 0
        self.invalid_steps = 0
        self.count = 0
        self.target = 0

    def _info(self, won: bool = False) -> dict:
        return {"target": self.target, "admissible_actions": ["inc", "dec"], "won": won}

    def _start_task(self, task_index: int) -> TaskStart:
        self.count, self.target = 0, task_index + 2
        return TaskStart(
            observation=f"Count to {self.target}. The counter is at 0.",
            task_id=f"count-{self.target}",
            info=self._info(),
        )

    def _engine_step(self, action: str) -> EngineStep:
        self.engine_steps += 1
        if action == "inc":
            self.count += 1
        elif action == "dec":
            self.count -= 1
        else:
            return EngineStep(NOTHING_HAPPENS, 0.0, False, self._info())
        won = self.count == self.target
        return EngineStep(f"The counter is at {self.count}.", 1.0 if won else 0.0, won, self._info(won))

    def _invalid_action_step(self) -> EngineStep:
        self.invalid_steps += 1
        return EngineStep(NOTHING_HAPPENS, 0.0, False, self._info())


class KeyDoorEnv(ToyTextEnv):
    """Key-and-door corridors; ``num_tasks`` of them, the key in room ``(7 * i) % rooms`` of task ``i``.

    The agent moves ``go left``/``go right``, takes the key (``take key``) in the key's room, and opens the
    door (``open door``) in the last room once it holds the key (reward 1, terminated). Anything else is
    "Nothing happens." The info carries ``admissible_actions`` (a list), a ``numpy.int64`` position and a
    tuple, so the server's codec is exercised on more than the base keys.

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
        super().__init__(
            num_tasks=num_tasks, max_steps=max_steps, history_depths=history_depths, render_mode=render_mode
        )
        if num_tasks < 1 or rooms < 2:
            raise ValueError("num_tasks must be >= 1 and rooms >= 2")
        self._num_tasks, self.rooms, self.crash_on = int(num_tasks), int(rooms), crash_on

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
            text = NOTHING_HAPPENS
        info = {**self._info(), "won": won}
        return EngineStep(text, 1.0 if won else 0.0, won, info)

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep(NOTHING_HAPPENS, 0.0, False, self._info())


OBJECTS = ("mug", "apple", "book", "pen", "plate", "egg", "cd")
PLACES = ("desk", "shelf", "countertop", "drawer", "cabinet", "sidetable")


class ToyALFWorldEnv(ToyTextEnv):
    """Task ``i``: a fixed plan of 3–5 commands; the right command advances, others: "Nothing happens.".

    Shaped like ALFWorld's infos: shuffled ``admissible_actions``, ``task_type`` (cycling through ALFWorld's
    six), ``won``, and with ``expert=True`` the ``expert_action``. Each observation ends with "Next you need
    to: <command>." so that a scripted LLM endpoint can play it to a win. A win pays 10.

    Args:
        num_tasks: Tasks in the split.
        max_steps: Actions per episode.
        expert: Put the plan's next command in ``info["expert_action"]``.
        step_delay: Seconds each engine step sleeps (a slow env, for concurrency tests).
        split: The split's name (every split has the same tasks).
        history_depths: Window depths for ``info["history_keys"]``.
    """

    metadata = {**TextEnv.metadata, "prompt_style": "alfworld"}

    def __init__(
        self,
        num_tasks: int = 12,
        max_steps: int = 12,
        expert: bool = False,
        step_delay: float = 0.0,
        split: str = "train",
        history_depths=(),
    ):
        super().__init__(num_tasks=num_tasks, max_steps=max_steps, history_depths=history_depths)
        self.expert = expert
        self.step_delay = step_delay
        self.split = split

    def _plan(self, index: int) -> tuple[str, str, list[str]]:
        obj, src, dst = (
            OBJECTS[index % len(OBJECTS)],
            PLACES[index % len(PLACES)],
            PLACES[(index + 2) % len(PLACES)],
        )
        plan = [f"go to {src} 1", f"take {obj} 1 from {src} 1"]
        if index % 3 == 1:
            plan.append(f"examine {obj} 1")
        plan += [f"go to {dst} 1", f"move {obj} 1 to {dst} 1"]
        return obj, dst, plan

    def _info(self) -> dict:
        done = self._progress >= len(self._plan_steps)
        distractors = [f"go to {p} 2" for p in PLACES[:4]] + ["look", "inventory", "help"]
        admissible = [] if done else sorted({self._plan_steps[self._progress], *distractors})
        order = self.np_random.permutation(len(admissible)) if admissible else []
        info = {"admissible_actions": [admissible[i] for i in order], "task_type": self._type, "won": done}
        if self.expert and not done:
            info["expert_action"] = self._plan_steps[self._progress]
        return info

    def _hint(self) -> str:
        if self._progress >= len(self._plan_steps):
            return ""
        return f" Next you need to: {self._plan_steps[self._progress]}."

    def _start_task(self, task_index: int) -> TaskStart:
        obj, dst, self._plan_steps = self._plan(task_index)
        self._type = TASK_TYPES[task_index % len(TASK_TYPES)]
        self._progress = 0
        obs = (
            f"-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.{self._hint()}\n\n"
            f"Your task is to: put some {obj} on {dst}."
        )
        return TaskStart(obs, f"toy-alfworld-{task_index}", self._info())

    def _engine_step(self, action: str) -> EngineStep:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self._progress < len(self._plan_steps) and action == self._plan_steps[self._progress]:
            self._progress += 1
            won = self._progress == len(self._plan_steps)
            return EngineStep(f"You did: {action}.{self._hint()}", 10.0 if won else 0.0, won, self._info())
        return self._invalid_action_step()

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep(f"{NOTHING_HAPPENS}{self._hint()}", 0.0, False, self._info())


class ToyWebShopEnv(ToyTextEnv):
    """Search, click the target product, buy: score 1 for the target, 0.25 for a wrong product.

    Shaped like WebShop's infos: ``available_actions`` (``has_search_bar``, ``clickables``), ``won``,
    ``task_score``, and with ``expert=True`` the ``expert_action``; observations end with "Next you need to:
    <action>." like :class:`ToyALFWorldEnv`'s. Arguments as :class:`ToyALFWorldEnv`'s.
    """

    metadata = {**TextEnv.metadata, "prompt_style": "webshop", "agentgym_flavor": "webshop"}

    def __init__(
        self,
        num_tasks: int = 8,
        max_steps: int = 8,
        expert: bool = False,
        step_delay: float = 0.0,
        split: str = "test",
    ):
        super().__init__(num_tasks=num_tasks, max_steps=max_steps)
        self.expert = expert
        self.step_delay = step_delay
        self.split = split

    def _page(self) -> tuple[str, dict, str | None]:
        goal = self._goal
        if self._stage == "search":
            return "Search", {"has_search_bar": True, "clickables": []}, f"search[{goal}]"
        if self._stage == "results":
            items = [f"b{self._target}", f"b{self._target + 100}", f"b{self._target + 200}"]
            text = "Back to Search [SEP] " + " [SEP] ".join(f"{i} [SEP] product {i}" for i in items)
            return (
                text,
                {"has_search_bar": False, "clickables": ["back to search", *items]},
                f"click[b{self._target}]",
            )
        return (
            f"Back to Search [SEP] product {self._chosen} [SEP] Buy Now",
            {"has_search_bar": False, "clickables": ["back to search", "buy now"]},
            "click[buy now]",
        )

    def _observation(self, page: str, expert: str | None) -> str:
        return f"WebShop [SEP] Instruction: [SEP] {self._goal} [SEP] {page} [SEP] Next you need to: {expert}."

    def _info(self, expert: str | None, available: dict, score: float = 0.0) -> dict:
        admissible = ["search[<query>]"] if available["has_search_bar"] else []
        admissible += [f"click[{c}]" for c in available["clickables"]]
        info = {
            "available_actions": available,
            "admissible_actions": admissible,  # as WebShop's own (webshop_server.engine.admissible_actions)
            "won": score == 1.0,
            "task_score": score,
        }
        if self.expert and expert is not None:
            info["expert_action"] = expert
        return info

    def _start_task(self, task_index: int) -> TaskStart:
        self._target = task_index
        self._goal = f"i need a red shirt number {task_index}, and price lower than 30.00 dollars"
        self._stage, self._chosen = "search", None
        page, available, expert = self._page()
        return TaskStart(
            self._observation(page, expert), f"toy-webshop-{task_index}", self._info(expert, available)
        )

    def _engine_step(self, action: str) -> EngineStep:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self._stage == "search" and action.startswith("search[") and action.endswith("]"):
            self._stage = "results"
        elif self._stage == "results" and action.startswith("click[b"):
            self._stage, self._chosen = "item", action[len("click[") : -1]
        elif self._stage != "search" and action == "click[back to search]":
            self._stage = "search"
        elif self._stage == "item" and action == "click[buy now]":
            score = 1.0 if self._chosen == f"b{self._target}" else 0.25
            return EngineStep(
                "Thank you for shopping with us!",
                score,
                True,
                self._info(None, {"has_search_bar": False, "clickables": []}, score),
            )
        else:
            return self._invalid_action_step()
        page, available, expert = self._page()
        return EngineStep(self._observation(page, expert), 0.0, False, self._info(expert, available))

    def _invalid_action_step(self) -> EngineStep:
        page, available, expert = self._page()
        return EngineStep(self._observation(page, expert), 0.0, False, self._info(expert, available))


class DrawerEnv(ToyTextEnv):
    """Task ``k`` of 8: "Your task is to: put the key in drawer {d}.", ALFWorld-styled and learnable by a tiny
    policy in milliseconds per step.

    Solved by two commands: ``take key 1`` then ``move key 1 to drawer {d}`` (reward 10); the wrong drawer
    drops the key again; any other command answers "Nothing happens." (the ALFWorld convention). With
    ``noisy_expert=True`` the expert's ``move`` names a random drawer, so imitating it wins only about half
    the episodes (two tries of four drawers) and RL has to learn to read the drawer from the task.

    Args:
        split: ``"train"``: drawers ``1 + k % 4`` for tasks ``k = 0..7``; any other split: the same drawers in
            reverse order (held-out task ids).
        max_steps: Actions per episode.
        expert: Put the expert's next command in ``info["expert_action"]``.
        history_depths: Window depths for ``info["history_keys"]``.
        noisy_expert: The expert's ``move`` names a random drawer.
        step_delay: Seconds each engine step sleeps (a slow env: a run that lasts while a test acts on it).
        **_: Other env arguments (``data_dir``, ...) the training loop passes to every env; ignored.
    """

    metadata = {**TextEnv.metadata, "prompt_style": "alfworld"}

    #: Drawers in the room.
    NUM_DRAWERS = 4

    def __init__(
        self,
        split: str = "train",
        max_steps: int = 4,
        expert: bool = False,
        history_depths=(),
        noisy_expert: bool = False,
        step_delay: float = 0.0,
        **_: object,
    ):
        targets = [1 + (k % self.NUM_DRAWERS) for k in range(8)]
        super().__init__(num_tasks=len(targets), max_steps=max_steps, history_depths=history_depths)
        self.split = split
        self.expert = expert
        self.noisy_expert = noisy_expert
        self.step_delay = step_delay
        self._targets = targets if split == "train" else targets[::-1]
        self._target = 1
        self._holding = False

    def _admissible(self) -> list[str]:
        drawers = range(1, self.NUM_DRAWERS + 1)
        base = ["look", "inventory"] + [f"open drawer {d}" for d in drawers]
        if self._holding:
            return base + [f"move key 1 to drawer {d}" for d in drawers]
        return base + ["take key 1"]

    def _info(self, won: bool = False) -> dict:
        info = {"admissible_actions": self._admissible(), "won": won, "task_type": "pick_and_place_simple"}
        if self.expert:
            drawer = (
                int(self.np_random.integers(1, self.NUM_DRAWERS + 1)) if self.noisy_expert else self._target
            )
            info["expert_action"] = f"move key 1 to drawer {drawer}" if self._holding else "take key 1"
        return info

    def _start_task(self, task_index: int) -> TaskStart:
        self._target = self._targets[task_index]
        self._holding = False
        obs = (
            f"-= Welcome to TextWorld, ALFRED! =-\n\nYou are in a room. You see a key 1 and "
            f"{self.NUM_DRAWERS} drawers.\n\nYour task is to: put the key in drawer {self._target}."
        )
        return TaskStart(obs, f"{self.split}-{task_index}", self._info())

    def _engine_step(self, action: str) -> EngineStep:
        if self.step_delay:
            time.sleep(self.step_delay)
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
        return EngineStep(NOTHING_HAPPENS, 0.0, False, self._info())


register_text_env(COUNTER_ENV_ID, f"{__name__}:CounterEnv")
register_text_env(KEY_DOOR_ENV_ID, f"{__name__}:KeyDoorEnv")
register_text_env(TOY_ALFWORLD_ENV_ID, f"{__name__}:ToyALFWorldEnv")
register_text_env(TOY_WEBSHOP_ENV_ID, f"{__name__}:ToyWebShopEnv")
register_text_env(DRAWER_ENV_ID, f"{__name__}:DrawerEnv")
