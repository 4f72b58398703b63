"""ALFWorld prompt style (structure of verl-agent ``agent_system/environments/prompts/alfworld.py``).

The role line names the ALFRED embodied environment; admissible commands are listed one per line in quotes
with ``help`` removed (verl-agent drops it: it is never useful to a policy); the task is the "Your task is to:
..." line of the first observation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agents.prompts.registry import register_style
from agents.prompts.style import EnvPromptStyle

_TASK_LINE = re.compile(r"Your task is to:\s*(.+)")
_WELCOME = re.compile(r"^\s*-= Welcome to TextWorld, ALFRED! =-\s*", re.IGNORECASE)


def task_text(observation: str, info: dict[str, Any]) -> str:
    """The task sentence of an ALFWorld episode (``info["task_description"]`` if the env gives it)."""
    for key in ("task_description", "task_text", "goal"):
        if isinstance(info.get(key), str) and info[key].strip():
            return info[key].strip()
    match = _TASK_LINE.search(observation)
    return match.group(1).strip().rstrip(".") if match else ""


def format_observation(observation: str) -> str:
    """Drop the TextWorld banner; the rest is shown verbatim."""
    return _WELCOME.sub("", observation).strip()


def admissible_actions(info: dict[str, Any]) -> list[str]:
    """``info["admissible_actions"]`` without ``help``."""
    actions = info.get("admissible_actions")
    if actions is None:
        actions = info.get("admissible_commands", [])
    return [str(a) for a in actions if str(a).strip() and str(a).strip().lower() != "help"]


def format_admissible(actions: Sequence[str]) -> str:
    return "\n ".join(f"'{a}'" for a in actions)


def shown_actions(actions: Sequence[str]) -> list[str]:
    """The actions a prompt lists: all but ``help``."""
    return [a for a in actions if a.strip().lower() != "help"]


STYLE = register_style(
    EnvPromptStyle(
        name="alfworld",
        role="You are an expert agent operating in the ALFRED Embodied Environment.",
        format_admissible=format_admissible,
        format_observation=format_observation,
        task_text=task_text,
        admissible_actions=admissible_actions,
        shown_actions=shown_actions,
    )
)
