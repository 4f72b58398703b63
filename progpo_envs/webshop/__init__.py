"""WebShop as Gymnasium text envs: ``progpo/WebShop-v0`` (:class:`~progpo_envs.webshop.env.WebShopEnv`,
in-process or over HTTP) and the real-browser variant (:mod:`progpo_envs.webshop.browser`). The shop itself,
with its scripted expert (:mod:`webshop_server.expert`), lives in :mod:`webshop_server`."""

from progpo_envs.webshop.env import RewardMode, WebShopEnv

__all__ = ["RewardMode", "WebShopEnv"]
