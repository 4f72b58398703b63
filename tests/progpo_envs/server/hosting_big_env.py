"""An env whose every answer is about a mebibyte, for the tests of long-lived stream connections:
importing this module registers ``progpo/BigToy-v0``.

It is the toy key-and-door env (:class:`progpo_envs.testing.KeyDoorEnv`) whose room descriptions carry a
mebibyte of wall writing (an invalid action's answer too), so a step's answer is ~1 MiB and 70 steps carry
more than 64 MiB (the client's bound on one answer, which its parser once applied to a whole connection);
under a ``progpo/`` id, so a server may host it. The env workers build it from the entry point (this module),
which the tests' ``pythonpath`` makes importable.
"""

from __future__ import annotations

from progpo_envs.core.registration import register_text_env
from progpo_envs.core.spaces import MAX_OBSERVATION_LENGTH
from progpo_envs.core.text_env import EngineStep
from progpo_envs.testing import KeyDoorEnv

BIG_ENV_ID = "progpo/BigToy-v0"
#: Characters of wall writing in every observation (the observation's bound less room for the rest).
WRITING = MAX_OBSERVATION_LENGTH - 4096


class BigRoomsEnv(KeyDoorEnv):
    """:class:`~progpo_envs.testing.KeyDoorEnv` with ~1 MiB observations and long episodes."""

    def __init__(self, *, max_steps: int = 10_000, **kwargs):
        super().__init__(max_steps=max_steps, **kwargs)

    def _describe(self) -> str:
        return super()._describe() + " The walls are covered in writing: " + "ab" * (WRITING // 2)

    def _invalid_action_step(self) -> EngineStep:  # an over-long action, too, is answered with a mebibyte
        return EngineStep(self._describe(), 0.0, False, self._info())


register_text_env(BIG_ENV_ID, f"{__name__}:BigRoomsEnv")
