"""Env construction for evaluation and training: one group vector env maker, remote envs included.

:func:`make_group_envs` makes ``num_groups × group_size`` copies of a registered env
(:class:`~progpo_envs.core.vector.GroupVectorEnv`: copies of a group share their task and reset seed). With a
``server_url`` the env is played on an env server (``progpo serve``): through ``progpo/Remote-v0`` hosting it,
for every env alike (an env's own ``url=``, such as WebShop's shop site, is one of its keyword arguments).
``server_url`` may name several env servers (a list, or URLs separated by commas):
``progpo/Remote-v0`` then spreads the groups over them and moves a lost server's groups to the others
(:mod:`progpo_envs.server.fleet`); :func:`server_status` reads each server's state and share.
``agents.evaluate`` and ``training.envs`` both make their envs here (the training loop names
``progpo/Remote-v0`` itself).

Example:
    >>> envs = make_group_envs("progpo/ALFWorld-v0", 2, 1, split="valid_seen")  # doctest: +SKIP
    >>> num_tasks(envs) > 0  # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

import progpo_envs  # noqa: F401  (registers the env ids, progpo/Remote-v0 included)
from agents.prompts import style_name_from_metadata
from progpo_envs.core import registration
from progpo_envs.core.registration import REMOTE_ENV_ID


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registration of ``env_id``; ``module:id`` imports ``module`` first (Gymnasium's syntax for an env
    registered by a module of its own, as ``gym.make`` reads it)."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return gym.spec(name)


def env_class(env_id: str) -> Any:
    """The class (or factory) the registered ``env_id`` is made by."""
    return registration.env_creator(env_spec(env_id).entry_point)


def listed_splits(env_id: str, env_kwargs: dict[str, Any]) -> list[str] | None:
    """The splits the registered env can be made with under ``env_kwargs`` here (its class's
    ``split_names``; ALFWorld: the data's folders, or the generated ones), or ``None`` when it does not list
    them (any plain name is tried)."""
    spec = env_spec(env_id)
    splits = registration.listed_splits(spec.entry_point, {**(spec.kwargs or {}), **env_kwargs})
    return None if splits is None else list(splits)


def accepts_url(env_id: str) -> bool:
    """Whether the registered env's constructor has a ``url`` parameter."""
    return "url" in inspect.signature(env_class(env_id)).parameters


def group_env_spec(
    env_id: str, env_kwargs: dict[str, Any], server_url: str | Sequence[str] | None = None
) -> tuple[str, dict]:
    """``(env id, kwargs)`` that :func:`make_group_envs` makes for ``env_id`` with ``env_kwargs`` on
    ``server_url``.

    Without ``server_url``: the env itself. With it (one env server or several): ``progpo/Remote-v0`` hosting
    ``env_id``, whatever the env (its kwargs travel with the create request; ``module:id`` hosts ``id``: the
    module is this process's import); ``progpo/Remote-v0`` itself gets it as its ``url``.

    Example:
        >>> group_env_spec("progpo/ALFWorld-v0", {"split": "train"})
        ('progpo/ALFWorld-v0', {'split': 'train'})
        >>> group_env_spec("progpo/ALFWorld-v0", {"split": "train"}, "http://host:8000")
        ('progpo/Remote-v0', {'split': 'train', 'url': 'http://host:8000', 'env_id': 'progpo/ALFWorld-v0'})
        >>> group_env_spec("progpo/WebShop-v0", {}, "http://host:8001")  # as ALFWorld: on the env server
        ('progpo/Remote-v0', {'url': 'http://host:8001', 'env_id': 'progpo/WebShop-v0'})
        >>> group_env_spec("progpo/ALFWorld-v0", {}, "http://a:8000,http://b:8000")[1]["url"]
        'http://a:8000,http://b:8000'
        >>> group_env_spec("progpo/WebShop-v0", {"url": "http://host:3000"})  # its own url=: the shop site
        ('progpo/WebShop-v0', {'url': 'http://host:3000'})
    """
    if server_url is None:
        return env_id, dict(env_kwargs)
    if env_id == REMOTE_ENV_ID:
        return env_id, {**env_kwargs, "url": server_url}
    if REMOTE_ENV_ID not in gym.registry:
        raise ValueError(f"{env_id} cannot be reached remotely: {REMOTE_ENV_ID} is not registered")
    return REMOTE_ENV_ID, {**env_kwargs, "url": server_url, "env_id": env_spec(env_id).id}


def make_group_envs(
    env_id: str,
    num_groups: int,
    group_size: int = 1,
    /,
    *,
    vector_mode: str = "sync",
    server_url: str | Sequence[str] | None = None,
    **env_kwargs: Any,
) -> gym.vector.VectorEnv:
    """``num_groups × group_size`` copies of ``env_id`` (see the module docstring for ``server_url``).

    Args:
        env_id: A registered env id (positional only, so ``progpo/Remote-v0`` copies can take ``env_id=``).
        num_groups: Task groups (one task index each at reset).
        group_size: Copies per group.
        vector_mode: ``sync`` (in-process) or ``async`` (subprocesses).
        server_url: The env server(s) the env is played on, if remote: one, or several (a list, or URLs
            separated by commas).
        **env_kwargs: Keyword arguments of every copy.

    Raises:
        ValueError: When the env does not take one of ``env_kwargs`` (the message names them).
    """
    make_id, kwargs = group_env_spec(env_id, env_kwargs, server_url)
    try:
        return gym.make_vec(
            make_id,
            num_envs=num_groups * group_size,
            group_size=group_size,
            vector_mode=vector_mode,
            **kwargs,
        )
    except TypeError as error:  # an argument the env does not take
        raise ValueError(f"{make_id} cannot be made with the arguments {sorted(kwargs)}: {error}") from error


def server_status(envs: Any) -> list[dict[str, Any]]:
    """Each env server's state and share when ``envs`` plays on several
    (:meth:`progpo_envs.server.fleet.FleetGroupVectorEnv.servers`: ``url``, ``state``, ``groups``,
    ``sessions``, ``failed_episodes``, ``lost_groups``, ...); ``[]`` for any other env."""
    servers = getattr(envs, "servers", None)
    return list(servers()) if callable(servers) else []


def first_copy_attribute(envs: gym.vector.VectorEnv, name: str) -> Any:
    """Attribute ``name`` of the first copy (via ``call`` where the vector env has it, else ``get_attr``)."""
    return envs.call(name)[0] if hasattr(envs, "call") else envs.get_attr(name)[0]


def num_tasks(envs: gym.vector.VectorEnv) -> int:
    """Tasks in the split the copies of ``envs`` play."""
    return int(first_copy_attribute(envs, "num_tasks"))


def task_types(envs: gym.vector.VectorEnv) -> list[str] | None:
    """The task type of each task of the split, when the env lists its tasks (``tasks``, each with a
    ``task_type``, as in-process ALFWorld does); ``None`` otherwise (WebShop's goals, a remote env)."""
    try:
        tasks = first_copy_attribute(envs, "tasks")
    except (AttributeError, RuntimeError):  # no ``tasks`` (RuntimeError: from an async worker)
        return None
    types = [getattr(task, "task_type", None) for task in tasks] if isinstance(tasks, (list, tuple)) else []
    return types if types and all(isinstance(t, str) for t in types) else None


def prompt_style(envs: gym.vector.VectorEnv) -> str:
    """The prompt style the copies' env names in its Gymnasium metadata (``metadata["prompt_style"]``; a
    remote env's is the hosted env's), else the generic ``text`` style; a :class:`ValueError` when it names
    a style that is not registered."""
    return style_name_from_metadata(first_copy_attribute(envs, "metadata"))


def split_name(envs: gym.vector.VectorEnv) -> str | None:
    """The name of the split the copies play (``train`` for WebShop by default); ``None`` if not known."""
    try:
        split = first_copy_attribute(envs, "split")
    except (AttributeError, RuntimeError):  # no ``split`` (RuntimeError: from an async worker)
        return None
    return None if split is None else str(getattr(split, "value", split))


def spread_tasks(split_size: int, count: int) -> list[int]:
    """``count`` task indices spread evenly over a split of ``split_size`` tasks (wrapping if it is smaller).

    The splits are sorted by task type, so an even spread holds every type: the trainer's held-out evaluation,
    its RL task pool (``rollout.task_pool``) and ``progpo eval --task-order spread`` are all drawn this way.

    Example:
        >>> spread_tasks(16, 4), spread_tasks(3, 5)
        ([0, 4, 8, 12], [0, 0, 1, 1, 2])
    """
    return [int(t) % split_size for t in np.linspace(0, split_size, count, endpoint=False).astype(int)]
