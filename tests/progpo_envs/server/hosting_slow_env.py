"""A slow env for the env server's drain test: ``--import tests.progpo_envs.server.hosting_slow_env``
registers ``progpo/SlowToy-v0``.

It is the toy ALFWorld (:class:`progpo_envs.testing.ToyALFWorldEnv`, whose ``step_delay`` makes each step
sleep) under a ``progpo/`` id, so ``progpo serve`` may host it; the workers build it from the entry point, so
only the serving process needs this module.
"""

from __future__ import annotations

from progpo_envs.core.registration import register_text_env

SLOW_ENV_ID = "progpo/SlowToy-v0"

register_text_env(SLOW_ENV_ID, "progpo_envs.testing:ToyALFWorldEnv")
