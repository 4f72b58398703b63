"""The base class of every text environment in this package.

A subclass supplies the task list and the engine; :class:`TextEnv` supplies everything the envs share:

* the Gymnasium contract (``reset(seed, options)``, ``step`` returning the 5-tuple, ``render``, ``close``);
* task selection: ``num_tasks`` tasks in a fixed order; ``reset(options={"task_index": i})`` plays task ``i``,
  otherwise the seeded ``np_random`` picks one;
* action sanitising: surrounding whitespace is stripped; anything that is not then a non-empty string of
  printable text within ``max_action_length`` characters is an invalid action, handled by the subclass like
  any other inadmissible command — never an exception;
* the step limit (``truncated`` at ``max_steps``);
* the content keys of :mod:`progpo_envs.core.history` in ``info`` (``obs_hash``, ``history_key``,
  ``history_keys``);
* ended episodes: once terminated or truncated, further ``step`` calls return the final observation again with
  reward 0 and the same flags, without touching the engine (a group rollout steps all copies until the last is
  done).

What a subclass states about itself, for the layers above that play it (which never test the env's id):

* ``metadata["prompt_style"]``: the name of the prompt style agents show it in (``"alfworld"``, ``"webshop"``;
  absent: the generic ``"text"`` style; the styles are registered in ``agents.prompts``);
* ``metadata["agentgym_flavor"]``: which AgentGym server's payloads ``progpo serve --agentgym`` speaks for it
  (``"webshop"``; absent: ALFWorld's shape);
* ``metadata["openenv_observation"]``: which observation model ``progpo serve --protocol openenv`` answers
  with (``"webshop"``: the page's ``available_actions``; absent: ``"text"``, the ``admissible_actions``);
* ``metadata["task_types"]``: the values its ``info["task_type"]`` takes (absent: none, one task family);
* :meth:`TextEnv.split_names`: the split names it can be made with, if it lists them.

The ``info`` contract every text env keeps (checked by :func:`progpo_envs.core.checker.check_text_env`) is in
:data:`progpo_envs.core.checker.INFO_KEYS`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from progpo_envs.core.history import HistoryTracker
from progpo_envs.core.spaces import MAX_ACTION_LENGTH, MAX_OBSERVATION_LENGTH, Unicode


@dataclasses.dataclass
class TaskStart:
    """What a subclass returns when it starts a task.

    Attributes:
        observation: The first observation (e.g. intro + task description).
        task_id: A stable identifier of the task (part of every history key).
        info: Env-specific info entries (e.g. ``admissible_actions``, ``task_type``).
    """

    observation: str
    task_id: str
    info: dict[str, Any]


@dataclasses.dataclass
class EngineStep:
    """What a subclass returns for one action.

    Attributes:
        observation: The engine's text after the action.
        reward: The reward for the action.
        terminated: The episode ended by the task's own rules (success, or a final failure).
        info: Env-specific info entries.
    """

    observation: str
    reward: float
    terminated: bool
    info: dict[str, Any]


#: Types whose values ``copy.deepcopy`` returns as they are (immutable scalars).
_ATOMIC_TYPES = frozenset({str, int, float, bool, type(None), bytes})


def copy_info(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy(value)``, several times faster on what infos are made of (plain dicts, lists, scalars).

    Plain dicts and lists are rebuilt here, sharing ``deepcopy``'s memo so that an object reached twice is
    copied once, as ``deepcopy`` does; builtin scalars and numpy numbers (immutable) are returned as they are;
    everything else goes to ``copy.deepcopy``.

    Example:
        >>> info = {"actions": ["look"], "won": False}
        >>> copied = copy_info(info)
        >>> copied == info and copied["actions"] is not info["actions"]
        True
    """
    kind = type(value)
    if kind in _ATOMIC_TYPES or isinstance(value, (np.number, np.bool_)):
        return value
    if memo is None:
        memo = {}
    if kind is dict:
        copied = memo.get(id(value))
        if copied is None:
            copied = memo[id(value)] = {}
            for key, item in value.items():
                copied[key if type(key) in _ATOMIC_TYPES else copy_info(key, memo)] = (
                    item if type(item) in _ATOMIC_TYPES else copy_info(item, memo)
                )
        return copied
    if kind is list:
        copied = memo.get(id(value))
        if copied is None:
            copied = memo[id(value)] = []
            copied.extend(item if type(item) in _ATOMIC_TYPES else copy_info(item, memo) for item in value)
        return copied
    return copy.deepcopy(value, memo)


def is_well_formed_action(action: Any, max_length: int) -> bool:
    """Whether ``action`` is a string of printable text (surrounding whitespace aside) of 1..``max_length``
    chars.

    A trailing newline or tab, as LLMs often emit, does not make an action malformed; it is stripped before
    the engine sees the action.
    """
    if not isinstance(action, str) or not 0 < len(action) <= max_length:
        return False
    text = action.strip()
    return text != "" and text.isprintable()


class TextEnv(gym.Env[str, str]):
    """Base class of text environments; see the module docstring for what it provides.

    Subclasses implement :attr:`num_tasks`, :meth:`_start_task`, :meth:`_engine_step` and
    :meth:`_invalid_action_step`.

    Args:
        max_steps: Actions per episode before ``truncated``.
        history_depths: Depths ``k`` for which ``info["history_keys"][k]`` is reported.
        max_action_length: Longest action string passed to the engine.
        render_mode: ``"ansi"`` (``render()`` returns the last observation) or ``None``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        *,
        max_steps: int,
        history_depths: Sequence[int] = (),
        max_action_length: int = MAX_ACTION_LENGTH,
        render_mode: str | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.max_steps = int(max_steps)
        self.max_action_length = int(max_action_length)
        self.render_mode = render_mode
        self.observation_space = Unicode(MAX_OBSERVATION_LENGTH)
        self.action_space = Unicode(self.max_action_length, min_length=1)
        self._history = HistoryTracker(depths=history_depths)
        self._last: tuple[str, bool, bool, dict[str, Any]] | None = None
        self._steps = 0

    # --- subclass interface ---------------------------------------------------------------------------------
    @classmethod
    def split_names(cls, **kwargs: Any) -> tuple[str, ...] | None:
        """The split names the env offers when made with the constructor arguments ``kwargs`` (the others
        take their defaults), or ``None`` when it does not list them (any plain name is tried).

        Asked before an env is made: by ``progpo eval --split`` and by an env server's allow-list (a split
        is a name a client may choose, never a path). Override it in an env with named splits.
        """
        return None

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the selected split."""
        raise NotImplementedError

    def _start_task(self, task_index: int) -> TaskStart:
        """Load task ``task_index`` (0 ≤ i < num_tasks, fixed order) and return its first observation."""
        raise NotImplementedError

    def _engine_step(self, action: str) -> EngineStep:
        """Apply a well-formed action string."""
        raise NotImplementedError

    def _invalid_action_step(self) -> EngineStep:
        """The result of an action that is not a well-formed string (empty, too long, binary, not a str)."""
        raise NotImplementedError

    # --- Gymnasium API --------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start an episode.

        Args:
            seed: Seeds ``np_random``, which picks the task unless ``options["task_index"]`` is given.
            options: ``{"task_index": i}`` plays task ``i`` of the split.
        """
        super().reset(seed=seed)
        options = options or {}
        if "task_index" in options and options["task_index"] is not None:
            task_index = int(options["task_index"])
            if not 0 <= task_index < self.num_tasks:
                raise ValueError(
                    f"task_index {task_index} out of range: the split has {self.num_tasks} tasks"
                )
        else:
            task_index = int(self.np_random.integers(self.num_tasks))
        start = self._start_task(task_index)
        self._history.set_task(start.task_id)
        self._steps = 0
        info = {
            **start.info,
            "task_index": task_index,
            "task_id": start.task_id,
            **self._history.reset(start.observation),
        }
        self._last = (start.observation, False, False, info)
        return start.observation, dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply ``action``; malformed actions are invalid actions, never errors."""
        if self._last is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        observation, terminated, truncated, info = self._last
        if terminated or truncated:
            return observation, 0.0, terminated, truncated, copy_info(info)
        if is_well_formed_action(action, self.max_action_length):
            result = self._engine_step(action.strip())
        else:
            result = self._invalid_action_step()
        action_text = action if isinstance(action, str) else ""
        self._steps += 1
        truncated = not result.terminated and self._steps >= self.max_steps
        info = {
            **result.info,
            "task_index": info["task_index"],
            "task_id": info["task_id"],
            **self._history.step(action_text, result.observation),
        }
        self._last = (result.observation, result.terminated, truncated, info)
        return result.observation, float(result.reward), result.terminated, truncated, dict(info)

    def render(self) -> str | None:
        """The last observation (``render_mode="ansi"``)."""
        if self.render_mode == "ansi" and self._last is not None:
            return self._last[0]
        return None

    @property
    def elapsed_steps(self) -> int:
        """Actions taken in the current episode."""
        return self._steps
