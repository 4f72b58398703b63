"""What an env contributes to its prompts: role line, task extraction, admissible-action listing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class EnvPromptStyle:
    """The env-specific parts of a prompt; the templates (``agents.prompts.templates``) are shared.

    Attributes:
        name: The env kind (``"alfworld"``, ``"webshop"``).
        role: The first line: who the agent is.
        task_prefix: Put before the task sentence.
        format_admissible: Renders the admissible list inside the prompt.
        format_observation: Cleans an observation for display (``(obs)`` or ``(obs, task)``).
        task_text: ``(first observation, reset info) -> task sentence``.
        admissible_actions: ``info -> list of action strings``.
        observation_needs_task: Whether ``format_observation`` takes the task (to strip it from the page).
    """

    name: str
    role: str
    task_prefix: str
    format_admissible: Callable[[Sequence[str]], str]
    format_observation: Callable[..., str]
    task_text: Callable[[str, dict[str, Any]], str]
    admissible_actions: Callable[[dict[str, Any]], list[str]]
    observation_needs_task: bool = False

    def clean_observation(self, observation: str, task: str) -> str:
        if self.observation_needs_task:
            return self.format_observation(observation, task)
        return self.format_observation(observation)
