"""``check_text_env(env)``: Gymnasium's ``check_env`` plus what the project reads from a text env.

Gymnasium's checker (``gymnasium.utils.env_checker.check_env``) checks the spaces, ``reset``/``step``
signatures and seeding. The layers above the env (the harness, the trainer, the env server) also read the
env's ``info`` and metadata; :data:`INFO_KEYS` is that contract, one line per key, and
:func:`check_text_env` plays one episode of task 0 and checks it at every step, with:

* the keys :class:`~progpo_envs.core.text_env.TextEnv` puts in every info (``task_index``, ``task_id``, and
  the content keys of :mod:`progpo_envs.core.history`: ``obs_hash`` is the digest of the observation itself,
  ``history_key`` changes with every step, ``history_keys[k]`` for each window depth the env was made with);
* the env's own keys: ``admissible_actions`` and ``won`` always, ``task_type``, ``task_score`` and
  ``expert_action`` with the types the readers expect when the env reports them;
* the text-env rules: the same seed and task give the same first observation, task and keys; a malformed
  action (not a string, empty, over ``max_action_length``) is an invalid action, never an exception; once
  ended, ``step`` returns the final observation again with reward 0 and the same flags;
* what the env states about itself: ``metadata["prompt_style"]`` a name (the agents layer checks it is a
  registered style when it plays the env), ``metadata["agentgym_flavor"]`` one of AgentGym's two,
  ``metadata["openenv_observation"]`` one of :data:`OPENENV_OBSERVATIONS`, ``metadata["task_types"]`` names,
  and :meth:`~progpo_envs.core.text_env.TextEnv.split_names` ``None`` or split names.

Every env's tests run it (ALFWorld, WebShop, the toy envs of :mod:`progpo_envs.testing`); a failure is an
``AssertionError`` naming the key and the step, as Gymnasium's checker does.

Example:
    >>> import gymnasium as gym
    >>> import progpo_envs.testing
    >>> check_text_env(gym.make(progpo_envs.testing.KEY_DOOR_ENV_ID).unwrapped)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from progpo_envs.core.hashing import text_digest

#: What the project reads from a text env's ``info``: key → (who needs it, what it must be).
INFO_KEYS: Mapping[str, str] = {
    "task_index": "always (TextEnv): the task played, 0 <= i < num_tasks",
    "task_id": "always (TextEnv): a stable id of the task, a str (part of every history key)",
    "obs_hash": "always (TextEnv): numpy.uint64 digest of the raw observation (the estimators' state key)",
    "history_key": "always (TextEnv): numpy.uint64 key of the task and the whole history so far",
    "history_keys": "with history_depths (TextEnv): {depth: numpy.uint64} keys of the last-k windows",
    "admissible_actions": "always (the env): list of str, the actions prompts list and projection matches",
    "won": "always (the env): bool, whether the task is solved (success rates)",
    "task_type": "optional: str, the task's type (per-type success tables, stratified task order)",
    "task_score": "optional: float in [0, 1], the task's own score (WebShop's purchase score)",
    "expert_action": "with expert=True: str, the expert's next action (None once it has none)",
}
#: The keys every info holds (the others of :data:`INFO_KEYS` are optional or depend on how the env is made).
REQUIRED_KEYS = ("task_index", "task_id", "obs_hash", "history_key", "admissible_actions", "won")
#: The AgentGym payload shapes an env may ask for (``metadata["agentgym_flavor"]``).
AGENTGYM_FLAVORS = ("alfworld", "webshop")
#: The OpenEnv observation models an env may ask for (``metadata["openenv_observation"]``).
OPENENV_OBSERVATIONS = ("text", "webshop")
#: Malformed actions every text env must take as invalid actions.
_MALFORMED: tuple[Any, ...] = ("", "   ", 12345, None)


def _fail(where: str, message: str) -> AssertionError:
    return AssertionError(f"{where}: {message}")


def _check_info(info: Any, observation: str, where: str, depths: list | None) -> None:
    if not isinstance(info, dict):
        raise _fail(where, f"info must be a dict, got {type(info).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in info]
    if missing:
        raise _fail(where, f"info lacks {missing} (progpo_envs.core.checker.INFO_KEYS says what each is)")
    if not isinstance(info["task_index"], (int, np.integer)) or isinstance(info["task_index"], bool):
        raise _fail(where, f"info['task_index'] must be an int, got {info['task_index']!r}")
    if not isinstance(info["task_id"], str):
        raise _fail(where, f"info['task_id'] must be a str, got {info['task_id']!r}")
    for key in ("obs_hash", "history_key"):
        if not isinstance(info[key], np.uint64):
            raise _fail(where, f"info[{key!r}] must be a numpy.uint64, got {type(info[key]).__name__}")
    if info["obs_hash"] != text_digest(observation):
        raise _fail(where, "info['obs_hash'] is not the digest of the observation (progpo_envs.core.hashing)")
    if depths is not None:
        keys = info.get("history_keys")
        if not isinstance(keys, dict) or sorted(keys) != depths:
            raise _fail(where, f"info['history_keys'] must hold the reset's depths {depths}, got {keys!r}")
        if not all(isinstance(key, np.uint64) for key in keys.values()):
            raise _fail(where, "info['history_keys'] values must be numpy.uint64")
    actions = info["admissible_actions"]
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise _fail(where, f"info['admissible_actions'] must be a list of str, got {actions!r}")
    if not isinstance(info["won"], (bool, np.bool_)):
        raise _fail(where, f"info['won'] must be a bool, got {info['won']!r}")
    if "task_type" in info and not isinstance(info["task_type"], str):
        raise _fail(where, f"info['task_type'] must be a str, got {info['task_type']!r}")
    if "task_score" in info:
        score = info["task_score"]
        if isinstance(score, bool) or not isinstance(score, (float, int, np.floating)) or not 0 <= score <= 1:
            raise _fail(where, f"info['task_score'] must be a number in [0, 1], got {score!r}")
    if "expert_action" in info and not isinstance(info["expert_action"], (str, type(None))):
        raise _fail(where, f"info['expert_action'] must be a str or None, got {info['expert_action']!r}")


def _check_statements(env: gym.Env) -> None:
    style = env.metadata.get("prompt_style")
    if style is not None and (not isinstance(style, str) or not style):
        raise _fail("metadata", f"metadata['prompt_style'] must be a style's name, got {style!r}")
    flavor = env.metadata.get("agentgym_flavor")
    if flavor is not None and flavor not in AGENTGYM_FLAVORS:
        raise _fail(
            "metadata", f"metadata['agentgym_flavor'] must be one of {AGENTGYM_FLAVORS}, got {flavor!r}"
        )
    observation = env.metadata.get("openenv_observation")
    if observation is not None and observation not in OPENENV_OBSERVATIONS:
        raise _fail(
            "metadata",
            f"metadata['openenv_observation'] must be one of {OPENENV_OBSERVATIONS}, got {observation!r}",
        )
    types = env.metadata.get("task_types")
    if types is not None and not (
        isinstance(types, (tuple, list)) and all(isinstance(t, str) and t for t in types)
    ):
        raise _fail("metadata", f"metadata['task_types'] must be a sequence of names, got {types!r}")
    listed = getattr(type(env), "split_names", None)
    if callable(listed):
        names = listed()
        if names is not None and not all(isinstance(n, str) and n for n in names):
            raise _fail("split_names()", f"must be None or split names, got {names!r}")


def _next_action(info: dict[str, Any]) -> Any:
    """The expert's action when the env gives one, else the first admissible one, else an arbitrary word."""
    expert = info.get("expert_action")
    if isinstance(expert, str) and expert:
        return expert
    return info["admissible_actions"][0] if info["admissible_actions"] else "look"


def check_text_env(env: gym.Env, *, seed: int = 0, max_steps: int = 200) -> None:
    """Check ``env`` against Gymnasium's API and the project's text-env contract (module docstring).

    Args:
        env: The env, unwrapped (``gym.make(...).unwrapped``), as Gymnasium's checker asks. It is reset and
            stepped, not closed.
        seed: The reset seed of the episodes played.
        max_steps: Steps of task 0 played at most (the expert's, or the first admissible action's).

    Raises:
        AssertionError: Naming the broken rule and where.
    """
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # Gymnasium's advice on e.g. observation dtypes; its errors still raise
        check_env(env, skip_render_check=True, skip_close_check=True)
    _check_statements(env)
    options = {"task_index": 0}
    first, info = env.reset(seed=seed, options=options)
    depths = sorted(info["history_keys"]) if isinstance(info, dict) and "history_keys" in info else None
    _check_info(info, first, "reset", depths)
    if info["task_index"] != 0:
        raise _fail("reset", f"options={{'task_index': 0}} played task {info['task_index']}")
    again, info_again = env.reset(seed=seed, options=options)
    for key in ("task_id", "obs_hash", "history_key"):
        if info_again[key] != info[key] or again != first:
            raise _fail("reset", f"the same seed and task gave another first observation or {key!r}")
    observation, keys = first, {info["history_key"]}
    for step in range(max_steps):
        where = f"step {step + 1}"
        action = _MALFORMED[step] if step < len(_MALFORMED) else _next_action(info)
        try:
            observation, reward, terminated, truncated, info = env.step(action)
        except Exception as error:  # noqa: BLE001 - the contract: never an exception for an action
            raise _fail(
                where, f"step({action!r}) raised {error!r}; a malformed action is an invalid one"
            ) from error
        _check_info(info, observation, where, depths)
        if not isinstance(observation, str):
            raise _fail(where, f"the observation must be a str, got {type(observation).__name__}")
        if info["history_key"] in keys:
            raise _fail(where, "info['history_key'] repeats an earlier step's (it must fold in every step)")
        keys.add(info["history_key"])
        if terminated or truncated:
            break
    else:
        return  # the episode is longer than max_steps: no end to check
    latched = env.step(_next_action(info))
    if latched[0] != observation or latched[1] != 0 or latched[2:4] != (terminated, truncated):
        raise _fail(
            f"after {where}", "an ended episode must return its final observation, reward 0 and its flags"
        )
    _check_info(latched[4], latched[0], f"after {where}", depths)
