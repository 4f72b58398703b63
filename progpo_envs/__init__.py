"""Gymnasium text environments for LLM agents: ALFWorld (real engine) and WebShop (self-hosted).

Importing the package registers the environments (nothing heavy is imported until one is made):

* ``progpo/ALFWorld-v0`` — :class:`progpo_envs.alfworld.env.ALFWorldEnv`
* ``progpo/WebShop-v0`` — :class:`progpo_envs.webshop.env.WebShopEnv`

Example:
    >>> import gymnasium as gym
    >>> import progpo_envs  # registers the ids
    >>> "progpo/ALFWorld-v0" in gym.registry
    True
"""

from progpo_envs.core.registration import register_text_env

register_text_env("progpo/ALFWorld-v0", "progpo_envs.alfworld.env:ALFWorldEnv")
register_text_env("progpo/WebShop-v0", "progpo_envs.webshop.env:WebShopEnv")

__version__ = "0.1.0"
