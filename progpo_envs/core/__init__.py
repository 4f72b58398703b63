"""What every text env in ``progpo_envs`` is built on: spaces, content hashing, history keys, the base env,
group vectorisation and registration."""

from progpo_envs.core.hashing import KeyRole, combine, hex_key, normalize_text, text_digest
from progpo_envs.core.history import HistoryTracker
from progpo_envs.core.registration import register_text_env
from progpo_envs.core.spaces import MAX_ACTION_LENGTH, MAX_OBSERVATION_LENGTH, Unicode
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv, is_well_formed_action
from progpo_envs.core.vector import GroupVectorEnv, VectorMode, make_group_vector_env

__all__ = [
    "MAX_ACTION_LENGTH",
    "MAX_OBSERVATION_LENGTH",
    "EngineStep",
    "GroupVectorEnv",
    "HistoryTracker",
    "KeyRole",
    "TaskStart",
    "TextEnv",
    "Unicode",
    "VectorMode",
    "combine",
    "hex_key",
    "is_well_formed_action",
    "make_group_vector_env",
    "normalize_text",
    "register_text_env",
    "text_digest",
]
