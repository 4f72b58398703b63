"""Registering text envs so that ``gymnasium.make`` and ``gymnasium.make_vec`` build them.

Every env is registered with its single-env ``entry_point`` and, as ``vector_entry_point``, a
:class:`~progpo_envs.core.vector.GroupVectorEnv` of the same entry point, so ``make_vec`` forms task groups.
Entry points are import strings: registering imports nothing heavy.

Importing :mod:`progpo_envs` registers the package's envs, :data:`REMOTE_ENV_ID` among them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from progpo_envs.core.vector import make_group_vector_env

#: The env that plays an env hosted by an env server (``progpo serve``):
#: :class:`progpo_envs.server.remote.RemoteEnv`, with its own batched group vector env; over several servers
#: (``url`` a list) :mod:`progpo_envs.server.fleet`'s.
REMOTE_ENV_ID = "progpo/Remote-v0"


def env_creator(entry_point: str | Callable) -> Any:
    """The class (or factory) a registration's ``entry_point`` names (``"module:Class"`` is imported)."""
    return load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point


def env_statements(entry_point: str | Callable) -> Mapping[str, Any]:
    """What the env class states about itself: its Gymnasium ``metadata`` (prompt style, AgentGym flavour,
    OpenEnv observation, task types; :mod:`progpo_envs.core.text_env`)."""
    return getattr(env_creator(entry_point), "metadata", {})


def listed_splits(entry_point: str | Callable, kwargs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The split names the env offers when made with ``kwargs``, or ``None`` if it does not list them: the
    env class's own :meth:`~progpo_envs.core.text_env.TextEnv.split_names` (ALFWorld's are the folders of
    ``<data_dir>/json_2.1.1``, or the generated splits without real data; WebShop's are its ``Split``
    values)."""
    listed = getattr(env_creator(entry_point), "split_names", None)
    names = listed(**kwargs) if callable(listed) else None
    return None if names is None else tuple(names)


def register_text_env(env_id: str, entry_point: str, **kwargs: Any) -> None:
    """Register ``env_id`` (e.g. ``"progpo/ALFWorld-v0"``) for ``gymnasium.make`` and group ``make_vec``.

    Args:
        env_id: The id, ``namespace/Name-vN``.
        entry_point: ``"module:Class"`` of a :class:`~progpo_envs.core.text_env.TextEnv` subclass.
        **kwargs: Default keyword arguments of the env.
    """
    if env_id in gym.registry:
        return
    gym.register(
        id=env_id,
        entry_point=entry_point,
        vector_entry_point=functools.partial(make_group_vector_env, entry_point),
        kwargs=kwargs,
    )
