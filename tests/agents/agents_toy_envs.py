"""Small TextEnv subclasses shaped like ALFWorld and WebShop, to test the harness without the real engines.

They follow the env contract the harness relies on (text observations; ``admissible_actions`` /
``available_actions``, ``task_type``, ``won``, ``task_score``, ``expert_action`` with ``expert=True``;
``task_index`` options; history keys from :class:`~progpo_envs.core.text_env.TextEnv`). Each observation also
says what the expert would do next ("Next you need to: ...") so that a scripted LLM endpoint can play them to
a win.

Importing this module registers ``agents-test/ToyALFWorld-v0`` and ``agents-test/ToyWebShop-v0``.
"""

from __future__ import annotations

import re
import time

from progpo_envs.core.registration import register_text_env
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

ALFWORLD_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
OBJECTS = ("mug", "apple", "book", "pen", "plate", "egg", "cd")
PLACES = ("desk", "shelf", "countertop", "drawer", "cabinet", "sidetable")


class ToyALFWorldEnv(TextEnv):
    """Task ``i``: a fixed plan of 3–5 commands; the right command advances, others: "Nothing happens."."""

    def __init__(
        self,
        num_tasks: int = 12,
        max_steps: int = 12,
        expert: bool = False,
        step_delay: float = 0.0,
        split: str = "train",
        history_depths=(),
    ):
        super().__init__(max_steps=max_steps, history_depths=history_depths)
        self._num_tasks = num_tasks
        self.expert = expert
        self.step_delay = step_delay
        self.split = split

    @property
    def num_tasks(self) -> int:
        return self._num_tasks

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
        self._type = ALFWORLD_TYPES[task_index % len(ALFWORLD_TYPES)]
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
        return EngineStep(f"Nothing happens.{self._hint()}", 0.0, False, self._info())


class ToyWebShopEnv(TextEnv):
    """Search, click the target product, buy: score 1 for the target, 0.25 for a wrong product."""

    def __init__(
        self,
        num_tasks: int = 8,
        max_steps: int = 8,
        expert: bool = False,
        step_delay: float = 0.0,
        split: str = "test",
    ):
        super().__init__(max_steps=max_steps)
        self._num_tasks = num_tasks
        self.expert = expert
        self.step_delay = step_delay
        self.split = split

    @property
    def num_tasks(self) -> int:
        return self._num_tasks

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
        info = {"available_actions": available, "won": score == 1.0, "task_score": score}
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


_HINT = re.compile(r"Next you need to: (.+?)\.(?=\s|'|$)")


def hint_policy(messages: list[dict], body: dict) -> str:
    """Answer the toy envs' current "Next you need to: X." hint in the verl-agent format."""
    text = messages[-1]["content"]
    text = text[: text.rfind("admissible actions")]
    hints = _HINT.findall(text)
    action = hints[-1] if hints else "look"
    return f"<think>The observation says what to do next.</think>\n<action>{action}</action>"


register_text_env("agents-test/ToyALFWorld-v0", "agents_toy_envs:ToyALFWorldEnv")
register_text_env("agents-test/ToyWebShop-v0", "agents_toy_envs:ToyWebShopEnv")
