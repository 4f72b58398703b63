"""``progpo/ALFWorld-v0``: ALFWorld's text games on the real engine, as a Gymnasium env.

Observation: the engine's text (on reset the intro, the room description and ``Your task is to: ...``).
Action: a command string; anything not admissible (including empty, huge or binary strings) gives the engine's
``"Nothing happens."`` and leaves the game unchanged. Reward ``success_reward`` (10, as in the
GiGPO/verl-agent RL setups; 1 is ALFWorld's own score) on the step that wins, else 0; the episode terminates
on a win and is truncated after ``max_steps`` actions (50, as ALFWorld's ``max_nb_steps_per_episode``).

``info`` holds ``admissible_actions`` (the engine's admissible commands without ``help``, as verl-agent
prompts show them), ``task_type``, ``task_id``, ``task_index``, ``won``, the history keys of
:class:`~progpo_envs.core.text_env.TextEnv` and, with ``expert=True``, ``expert_action`` (the next command of
:class:`~progpo_envs.alfworld.expert.ALFWorldExpert`, computed from the true state).

Example:
    >>> import gymnasium as gym, progpo_envs
    >>> data = "/data/alfworld"  # the folder that contains json_2.1.1/
    >>> env = gym.make("progpo/ALFWorld-v0", split="valid_seen", data_dir=data)  # doctest: +SKIP
    >>> obs, info = env.reset(options={"task_index": 0})  # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from progpo_envs.alfworld import data
from progpo_envs.alfworld.data import ALFWorldTask, load_tasks
from progpo_envs.alfworld.engine import NOTHING_HAPPENS, SHARED_GAMES_CAPACITY, AlfredEngine, EnginePatches
from progpo_envs.alfworld.expert import ALFWorldExpert, ExpertMode, SearchingExpert
from progpo_envs.alfworld.task_types import TASK_TYPES
from progpo_envs.core.errors import EnvDataError
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv

#: Admissible command the engine always offers and prompts leave out.
HELP_COMMAND = "help"


class ALFWorldEnv(TextEnv):
    """ALFWorld on TextWorld's PDDL engine (see the module docstring).

    Args:
        split: ``train``, ``valid_seen``, ``valid_unseen`` (or any folder of ``json_2.1.1``, such as
            ``valid_train``).
        data_dir: The folder that contains ``json_2.1.1/`` (default ``$ALFWORLD_DATA``; unset: generated
            games; ``"generated"``: generated games whatever ``$ALFWORLD_DATA`` says).
        max_steps: Actions per episode before truncation.
        expert: Put the expert's next command in ``info["expert_action"]``.
        expert_mode: ``"planner"`` (from the true state) or ``"searching"`` (only what the agent has seen:
            it searches receptacles in order; :class:`~progpo_envs.alfworld.expert.SearchingExpert`).
        success_reward: Reward for winning (10; ALFWorld's own score is 1).
        history_depths: Depths ``k`` of ``info["history_keys"][k]``.
        num_generated: Games per split generated when there is no real data (default 36).
        generator_seed: Seed of the generated game set.
        task_types: Only these task types (names, or ALFWorld's numbers 1..6 as in its ``env.task_types``).
        scenes: Only trials in these FloorPlans (generated sets are drawn in them).
        engine_patches: Fixes applied to the stock engine (all on by default).
        max_cached_games: Loaded games kept per env, so resetting one again is cheap.
        render_mode: ``"ansi"`` or ``None``.
    """

    metadata = {**TextEnv.metadata, "prompt_style": "alfworld", "task_types": TASK_TYPES}

    @classmethod
    def split_names(cls, data_dir: str | Path | None = None, **_: Any) -> tuple[str, ...]:
        """The folders of ``<data_dir>/json_2.1.1`` (``data_dir``, else ``$ALFWORLD_DATA``), or the generated
        splits without real data (:func:`progpo_envs.alfworld.data.split_names`)."""
        return tuple(data.split_names(data_dir))

    def __init__(
        self,
        split: str = "train",
        data_dir: str | Path | None = None,
        max_steps: int = 50,
        expert: bool = False,
        expert_mode: ExpertMode | str = ExpertMode.PLANNER,
        success_reward: float = 10.0,
        history_depths: Sequence[int] = (),
        num_generated: int | None = None,
        generator_seed: int = 0,
        task_types: Sequence[str | int] | None = None,
        scenes: Sequence[int] | None = None,
        engine_patches: EnginePatches | None = None,
        max_cached_games: int = 16,
        render_mode: str | None = None,
    ):
        super().__init__(max_steps=max_steps, history_depths=history_depths, render_mode=render_mode)
        self.split = split
        self.expert = bool(expert)
        self.expert_mode = ExpertMode(expert_mode)
        self._searcher: SearchingExpert | None = None
        self.success_reward = float(success_reward)
        self.tasks: list[ALFWorldTask] = load_tasks(
            split,
            data_dir,
            num_generated=num_generated,
            generator_seed=generator_seed,
            task_types=task_types,
            scenes=scenes,
        )
        self.engine = AlfredEngine(
            engine_patches,
            max_cached_games=max_cached_games,
            disk_cache=data.cache_dir() / "alfworld" / "engine",
        )
        self._game_files: dict[str, Path] = {}
        self._experts: dict[str, ALFWorldExpert] = {}
        self._task: ALFWorldTask | None = None

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the split."""
        return len(self.tasks)

    @property
    def task(self) -> ALFWorldTask | None:
        """The task being played."""
        return self._task

    @property
    def game_file(self) -> Path | None:
        """The ``game.tw-pddl`` being played (the trial's own or a rebuilt one)."""
        return self._game_files.get(self._task.task_id) if self._task else None

    def _start_task(self, task_index: int) -> TaskStart:
        task = self.tasks[task_index]
        game_file = self._game_files.get(task.task_id)
        if game_file is None:
            game_file = self._game_files[task.task_id] = task.game_file()
        self._task = task
        self._searcher = None
        observation = self.engine.reset(game_file)
        return TaskStart(observation=observation, task_id=task.task_id, info=self._info())

    def _engine_step(self, action: str) -> EngineStep:
        searcher = self._searcher
        if searcher is not None and action not in self.engine.admissible_commands:
            searcher = None  # the engine will not execute it: nothing new is seen
        observation = self.engine.step(action)
        if searcher is not None:
            searcher.record(action)
        won = self.engine.won
        return EngineStep(
            observation=observation,
            reward=self.success_reward if won else 0.0,
            terminated=won,
            info=self._info(),
        )

    def _invalid_action_step(self) -> EngineStep:
        # What the engine answers to any command that is not admissible; the game state does not change.
        return EngineStep(observation=NOTHING_HAPPENS, reward=0.0, terminated=False, info=self._info())

    def _info(self) -> dict[str, Any]:
        admissible = self.engine.admissible_commands
        info: dict[str, Any] = {
            "admissible_actions": [command for command in admissible if command != HELP_COMMAND],
            "task_type": self._task.task_type,
            "won": self.engine.won,
        }
        if self.expert:
            if self.expert_mode is ExpertMode.SEARCHING:
                if self._searcher is None:
                    self._searcher = SearchingExpert(self._expert())
                info["expert_action"] = self._searcher.next_action(self.engine.facts(), admissible)
            else:
                info["expert_action"] = self._expert().next_action(self.engine.facts(), admissible)
        return info

    def _expert(self) -> ALFWorldExpert:
        expert = self._experts.get(self._task.task_id)
        if expert is None:
            expert = self._experts[self._task.task_id] = ALFWorldExpert(self._task.traj_data())
        return expert

    def warm_up(self) -> int:
        """Load every game of the split into the process's shared game cache when they all fit in it; the
        number of games loaded (0: the split is larger than the cache, and its games load as they are met).

        An env server's worker calls this once before it serves. Its instances meet the split's games at
        random (a group's task each reset), so without it a worker's memory grows with every game it meets for
        the first time: ~1.6 MiB a game (the loaded game, its translation, TextWorld's interned propositions),
        and, under the soak's ALFWorld traffic (36 generated games, ~3 groups a worker an iteration), over
        half the run before every game has been met. Loading the 36 games takes about a second, and the
        first reset of each is then as cheap as any other. A game that cannot be loaded is left to the reset
        that meets it, which reports it (a damaged file is that task's fault, not the worker's).
        """
        if self.num_tasks > SHARED_GAMES_CAPACITY:
            return 0
        loaded = 0
        for index in range(self.num_tasks):
            with contextlib.suppress(EnvDataError):
                self._start_task(index)
                loaded += 1
        self._task = None
        return loaded

    def close(self) -> None:
        """Release the engine's loaded games."""
        self.engine.close()
        super().close()
