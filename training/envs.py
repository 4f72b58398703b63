"""The training run's envs: a split's group vector env from the ``env`` config.

Every env the trainer, the warm start and the probes play is made by :func:`make_split_envs`, which turns the
:class:`~training.config.EnvConfig` into keyword arguments (``train_kwargs`` over ``kwargs`` on the training
split) and hands them to :func:`agents.envs.make_group_envs`, the maker evaluation uses too. With ``env.url``
the env is played on an env server through ``progpo/Remote-v0``.

Example:
    >>> split_env_kwargs(EnvConfig(kwargs={}), "valid_seen")["split"]
    'valid_seen'
"""

from __future__ import annotations

import os

import gymnasium as gym

from agents.envs import make_group_envs
from progpo_envs.core.registration import REMOTE_ENV_ID
from training.config import EnvConfig


def data_dir_value(data_dir: str) -> str:
    """``env.data_dir`` with a leading ``$VAR`` replaced by that environment variable's value (empty when
    unset).

    Example:
        >>> os.environ["PROGPO_DOCTEST_DATA"] = "/data/alfworld"
        >>> data_dir_value("$PROGPO_DOCTEST_DATA"), data_dir_value("generated")
        ('/data/alfworld', 'generated')
    """
    return os.environ.get(data_dir[1:], "") if data_dir.startswith("$") else data_dir


def split_env_kwargs(env: EnvConfig, split: str, expert: bool = False) -> dict:
    """The keyword arguments of every copy of ``split``'s env (the env id and ``url`` aside).

    Example:
        >>> from training.config import EnvConfig
        >>> sorted(split_env_kwargs(EnvConfig(kwargs={}, train_kwargs={"num_generated": 8}), "train"))
        ['max_steps', 'num_generated', 'split']
    """
    kwargs = dict(env.kwargs)
    if split == env.train_split:
        kwargs.update(env.train_kwargs)
    kwargs.update(split=split, max_steps=env.max_steps)
    if env.data_dir:
        kwargs["data_dir"] = data_dir_value(env.data_dir)
    if expert:
        kwargs["expert"] = True
    if env.vector_mode == "async":
        kwargs["num_workers"] = env.num_workers or None
    return kwargs


def make_split_envs(
    env: EnvConfig, split: str, num_groups: int, group_size: int, expert: bool = False
) -> gym.vector.VectorEnv:
    """``num_groups × group_size`` copies of ``env.id`` on ``split`` (``expert``: with the expert's next
    command in ``info["expert_action"]``); on the env server at ``env.url`` when it is set."""
    kwargs = split_env_kwargs(env, split, expert)
    if env.url:  # the same env hosted by an env server (its kwargs travel with the create request)
        return make_group_envs(
            REMOTE_ENV_ID,
            num_groups,
            group_size,
            vector_mode=env.vector_mode,
            url=env.url,
            env_id=env.id,
            **kwargs,
        )
    return make_group_envs(env.id, num_groups, group_size, vector_mode=env.vector_mode, **kwargs)
