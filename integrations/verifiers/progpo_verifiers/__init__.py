"""ALFWorld and WebShop (ProGPO suite) as a verifiers environment: ``vf-eval progpo_verifiers`` or ``vf-eval @
alfworld.toml`` against a ``progpo serve --protocol openenv`` server.

verifiers finds the taskset and its env by this package's ``__all__`` (its plugin convention);
:func:`load_environment` builds the same env in Python, as verifiers' own ``vf.load_environment`` does for a
config.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

from progpo_verifiers.taskset import ProgpoEnv, ProgpoTaskset

__all__ = ["ProgpoEnv", "ProgpoTaskset", "load_environment"]


def load_environment(base_url: str, env_kind: str = "alfworld", **taskset: Any) -> vf.Env:
    """The env for the server at ``base_url`` hosting ``env_kind`` (``alfworld`` or ``webshop``); the other
    keywords are :class:`~progpo_verifiers.taskset.ProgpoConfig`'s (``split``, ``seed``, ``task_indices``,
    ...)."""
    config = {"taskset": {"id": __name__, "base_url": base_url, "env_kind": env_kind, **taskset}}
    return vf.load_environment(vf.resolve_env_config(config))
