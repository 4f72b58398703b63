"""WebShop as Gymnasium text envs: ``progpo/WebShop-v0`` (:class:`~progpo_envs.webshop.env.WebShopEnv`,
in-process or over HTTP), the real-browser variant (:mod:`progpo_envs.webshop.browser`) and the scripted
expert (:mod:`progpo_envs.webshop.expert`). The shop itself lives in :mod:`webshop_server`."""

from progpo_envs.webshop.env import RewardMode, WebShopEnv

__all__ = ["RewardMode", "WebShopEnv"]
