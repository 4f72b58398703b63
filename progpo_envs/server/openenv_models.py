"""The OpenEnv wire models of the hosted text envs: one action with a ``command`` string, and observations
that declare every field a trainer reads.

OpenEnv (``huggingface/OpenEnv``, package ``openenv``) describes an env by three pydantic models, published
at ``/schema``: the action a client sends, the observation it gets back (``reward`` and ``done`` are lifted
out of it onto the answer) and the state (``/state``, the ``state`` message). Older OpenEnv servers drop an
observation's ``metadata`` on the wire, and generic clients (TRL, verifiers' OpenEnv taskset) read only
declared fields, so everything our ``info`` carries that a trainer needs is a declared field here:

* :class:`CommandAction` — ``{"command": str}``, the only required field: a text-only client sends the model's
  text as it is. Any string is accepted; one the env cannot execute is an *invalid action* (the env's own
  answer, e.g. ALFWorld's ``Nothing happens.``), never an error. A non-string is a validation error.
* :class:`ALFWorldObservation` — ``text`` and ``admissible_actions`` (the commands the engine accepts now);
* :class:`WebShopObservation` — ``text``, ``available_actions`` (WebShop's ``{has_search_bar, clickables}``)
  and ``action_valid``;
* both (:class:`TextObservation`): ``obs_hash`` and ``history_key`` (our content keys, unsigned 64-bit
  integers: equal states have equal keys in every process, so any trainer can form GiGPO/ProGPO-style step
  groups), ``history_keys`` (window keys, when the env was made with ``history_depths``), ``task_id``,
  ``task_index`` (and ``num_tasks``, the split's size), ``task_type`` (ALFWorld's six types; ``""`` for
  WebShop, whose goals have none), ``won``, ``task_score`` (WebShop's raw 0-1 purchase score; ALFWorld's 1.0
  for a win, else 0.0) and ``truncated`` (the step limit ended the episode; ``done`` is terminated or
  truncated).

No field gives the answer away: trainers' clients (verifiers' OpenEnv taskset, SkyRL's example) put the whole
observation in the policy's prompt, so the expert's next command, where the operator turned the expert on, is
read from the server's own ``GET /expert`` route (:mod:`~progpo_envs.server.openenv_app`), never from here.

:func:`observation_of` builds an observation from what the env pool answers (the env's text, reward, flags and
decoded ``info``).

Example:
    >>> import numpy as np
    >>> info = {"admissible_actions": ["look", "go to desk 1"], "task_type": "pick_and_place_simple",
    ...         "won": False, "task_id": "t0", "task_index": 0, "obs_hash": np.uint64(2**64 - 1),
    ...         "history_key": np.uint64(7)}
    >>> obs = observation_of(ALFWorldObservation, "You are in a room.", info)
    >>> obs.admissible_actions, obs.obs_hash == 2**64 - 1, obs.done, obs.reward
    (['look', 'go to desk 1'], True, False, None)
    >>> CommandAction(command="look").command
    'look'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, ConfigDict, Field


class CommandAction(Action):
    """One action: the command text (any string; one the env cannot execute is an invalid action)."""

    command: str = Field(
        description="The command, e.g. 'go to desk 1' (ALFWorld) or 'search[red mug]' (WebShop)"
    )


class TextObservation(Observation):
    """What every hosted text env reports after a reset or a step (``reward`` and ``done`` are OpenEnv's)."""

    text: str = Field(description="The env's observation text")
    obs_hash: int = Field(
        description="Content key of the observation (unsigned 64-bit; equal text, equal key)"
    )
    history_key: int = Field(
        description="Content key of the task, the actions and observations so far (uint64)"
    )
    history_keys: dict[int, int] = Field(
        default_factory=dict, description="Window keys by depth (envs made with history_depths)"
    )
    task_id: str = Field(description="Stable id of the task played")
    task_index: int = Field(description="Position of the task in the split")
    num_tasks: int | None = Field(default=None, description="Tasks in the split (task_index < num_tasks)")
    task_type: str = Field(default="", description="The task's type (ALFWorld's six; empty for WebShop)")
    won: bool = Field(default=False, description="The task is solved")
    task_score: float = Field(
        default=0.0, description="WebShop: the raw 0-1 purchase score; ALFWorld: 1.0 on a win"
    )
    truncated: bool = Field(default=False, description="The step limit ended the episode")


class ALFWorldObservation(TextObservation):
    """ALFWorld's observation: the text and the commands the engine accepts now."""

    admissible_actions: list[str] = Field(
        default_factory=list, description="The commands the engine accepts in this state (without 'help')"
    )


class WebShopActions(BaseModel):
    """WebShop's actions on the current page, in WebShop's own form."""

    model_config = ConfigDict(extra="forbid")

    has_search_bar: bool = Field(description="The page has a search bar: 'search[<query>]' is available")
    clickables: list[str] = Field(description="What 'click[<x>]' may name on this page")


class WebShopObservation(TextObservation):
    """WebShop's observation: the page text, its actions and whether the last action was valid."""

    available_actions: WebShopActions = Field(description="Actions available on this page")
    action_valid: bool = Field(
        default=True, description="The last action was a well-formed, available action"
    )


class TextEnvState(State):
    """The session's state (``/state``, the ``state`` message); OpenEnv's fields and the task."""

    env_id: str = Field(description="The hosted env, e.g. progpo/ALFWorld-v0")
    task_index: int | None = Field(default=None, description="The task being played (None before a reset)")
    task_id: str | None = Field(default=None, description="Stable id of that task")
    done: bool = Field(default=False, description="The episode has ended")


def observation_class(statements: Mapping[str, Any]) -> type[TextObservation]:
    """The observation model an env asks for (``metadata["openenv_observation"]``): WebShop's page actions for
    ``"webshop"``, the admissible actions (ALFWorld's model) for ``"text"`` or none."""
    return WebShopObservation if statements.get("openenv_observation") == "webshop" else ALFWorldObservation


def _task_score(info: Mapping[str, Any]) -> float:
    if "task_score" in info:
        return float(info["task_score"])
    return 1.0 if info.get("won") else 0.0


def observation_of(
    cls: type[TextObservation],
    text: str,
    info: Mapping[str, Any],
    reward: float | None = None,
    terminated: bool = False,
    truncated: bool = False,
    num_tasks: int | None = None,
) -> TextObservation:
    """The observation ``cls`` for an env answer (``info`` decoded: numpy keys become Python ints) in a split
    of ``num_tasks`` tasks."""
    fields: dict[str, Any] = {
        "text": text,
        "obs_hash": int(info["obs_hash"]),
        "history_key": int(info["history_key"]),
        "history_keys": {int(k): int(v) for k, v in (info.get("history_keys") or {}).items()},
        "task_id": str(info["task_id"]),
        "task_index": int(info["task_index"]),
        "num_tasks": num_tasks,
        "task_type": str(info.get("task_type") or ""),
        "won": bool(info.get("won", False)),
        "task_score": _task_score(info),
        "truncated": bool(truncated),
        "reward": None if reward is None else float(reward),
        "done": bool(terminated or truncated),
    }
    if issubclass(cls, WebShopObservation):
        fields["available_actions"] = WebShopActions(**info["available_actions"])
        fields["action_valid"] = bool(info.get("action_valid", True))
    elif issubclass(cls, ALFWorldObservation):
        fields["admissible_actions"] = list(info.get("admissible_actions") or [])
    return cls(**fields)
