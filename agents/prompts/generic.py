"""The generic prompt style (``text``): for an env whose metadata names no style of its own.

The role line says only that the agent acts in a text environment; the task is an info entry
(``task_text``, ``task_description``, ``instruction_text`` or ``goal``), else the first observation itself;
the admissible actions are ``info["admissible_actions"]``, listed one per line in quotes; observations are
shown as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.prompts.registry import DEFAULT_STYLE, register_style
from agents.prompts.style import EnvPromptStyle

#: Info entries that may hold the task sentence, in the order they are looked for.
TASK_KEYS = ("task_text", "task_description", "instruction_text", "goal")


def task_text(observation: str, info: dict[str, Any]) -> str:
    """The task: an info entry of :data:`TASK_KEYS`, else the first observation.

    Example:
        >>> task_text("Guess my number (1-8).", {}), task_text("Hello.", {"goal": "say hi"})
        ('Guess my number (1-8).', 'say hi')
    """
    for key in TASK_KEYS:
        if isinstance(info.get(key), str) and info[key].strip():
            return info[key].strip()
    return observation.strip()


def format_observation(observation: str) -> str:
    return observation.strip()


def admissible_actions(info: dict[str, Any]) -> list[str]:
    """``info["admissible_actions"]`` as strings (empty entries left out)."""
    return [str(a) for a in info.get("admissible_actions") or [] if str(a).strip()]


def format_admissible(actions: Sequence[str]) -> str:
    return "\n ".join(f"'{a}'" for a in actions)


STYLE = register_style(
    EnvPromptStyle(
        name=DEFAULT_STYLE,
        role="You are an expert agent operating in a text environment.",
        format_admissible=format_admissible,
        format_observation=format_observation,
        task_text=task_text,
        admissible_actions=admissible_actions,
    )
)
