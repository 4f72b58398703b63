"""Gymnasium text environments for LLM agents: ALFWorld (real engine) and WebShop (self-hosted).

Importing the package registers the environments (nothing heavy is imported until one is made):

* ``progpo/ALFWorld-v0`` — :class:`progpo_envs.alfworld.env.ALFWorldEnv`
* ``progpo/WebShop-v0`` — :class:`progpo_envs.webshop.env.WebShopEnv`
* ``progpo/Remote-v0`` — :class:`progpo_envs.server.remote.RemoteEnv` (an env hosted by ``progpo serve``;
  ``url`` may name several servers: :mod:`progpo_envs.server.fleet`)

Example:
    >>> import gymnasium as gym
    >>> import progpo_envs  # registers the ids
    >>> "progpo/ALFWorld-v0" in gym.registry
    True
"""

import gymnasium as gym

from progpo_envs.core.registration import REMOTE_ENV_ID, register_text_env

register_text_env("progpo/ALFWorld-v0", "progpo_envs.alfworld.env:ALFWorldEnv")
register_text_env("progpo/WebShop-v0", "progpo_envs.webshop.env:WebShopEnv")
if REMOTE_ENV_ID not in gym.registry:
    # The remote env batches a whole vector step into one request per server, so it has its own vector env;
    # the entry points make the one-server classes (progpo_envs.server.remote), or the fleet's for several.
    gym.register(
        id=REMOTE_ENV_ID,
        entry_point="progpo_envs.server.fleet:make_remote_env",
        vector_entry_point="progpo_envs.server.fleet:make_remote_vector_env",
    )

__version__ = "0.1.0"
