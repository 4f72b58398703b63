"""Registering text envs so that ``gymnasium.make`` and ``gymnasium.make_vec`` build them.

Every env is registered with its single-env ``entry_point`` and, as ``vector_entry_point``, a
:class:`~progpo_envs.core.vector.GroupVectorEnv` of the same entry point, so ``make_vec`` forms task groups.
Entry points are import strings: registering imports nothing heavy.

Importing :mod:`progpo_envs` registers the package's envs, :data:`REMOTE_ENV_ID` among them.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym

from progpo_envs.core.vector import make_group_vector_env

#: The env that plays an env hosted by an env server (``progpo serve``):
#: :class:`progpo_envs.server.remote.RemoteEnv`, with its own batched group vector env.
REMOTE_ENV_ID = "progpo/Remote-v0"


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
