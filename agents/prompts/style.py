"""What an env contributes to its prompts: role line, task extraction, admissible-action listing, and the
env-specific rules about its actions (which listed commands to hide, which entries are patterns to fill)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def _keep_every_action(actions: Sequence[str]) -> list[str]:
    return list(actions)


@dataclasses.dataclass(frozen=True)
class EnvPromptStyle:
    """The env-specific parts of a prompt; the templates (``agents.prompts.templates``) are shared.

    An env names its style in its Gymnasium metadata (``metadata["prompt_style"]``); the styles are registered
    by name (:func:`agents.prompts.register_style`).

    Attributes:
        name: The style's name (``"alfworld"``, ``"webshop"``, ``"text"``).
        role: The first line: who the agent is.
        format_admissible: Renders the admissible list inside the prompt.
        format_observation: Cleans an observation for display (``(obs)`` or ``(obs, task)``).
        task_text: ``(first observation, reset info) -> task sentence``.
        admissible_actions: ``info -> list of action strings``.
        task_prefix: Put before the task sentence (the RL papers' ``Your task is to: ``).
        observation_needs_task: Whether ``format_observation`` takes the task (to strip it from the page).
        shown_actions: The listed actions a prompt shows, of those it is given (ALFWorld leaves out ``help``).
        action_patterns: Listed entries that stand for a family of actions, each with the ``str.format``
            pattern of a concrete one from free text (WebShop: ``search[<your query>]`` → ``search[{}]``).
    """

    name: str
    role: str
    format_admissible: Callable[[Sequence[str]], str]
    format_observation: Callable[..., str]
    task_text: Callable[[str, dict[str, Any]], str]
    admissible_actions: Callable[[dict[str, Any]], list[str]]
    task_prefix: str = "Your task is to: "
    observation_needs_task: bool = False
    shown_actions: Callable[[Sequence[str]], list[str]] = _keep_every_action
    action_patterns: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)

    def clean_observation(self, observation: str, task: str) -> str:
        if self.observation_needs_task:
            return self.format_observation(observation, task)
        return self.format_observation(observation)

    def is_pattern(self, command: str) -> bool:
        """Whether ``command`` is a pattern entry (an action family), not an action itself."""
        return command in self.action_patterns

    def fill(self, command: str, text: str) -> str:
        """The concrete action for a listed ``command``: itself, or a pattern entry filled with ``text``.

        Example:
            >>> from agents.prompts import get_style
            >>> get_style("webshop").fill("search[<your query>]", "red socks")
            'search[red socks]'
            >>> get_style("webshop").fill("click[buy now]", "red socks")
            'click[buy now]'
        """
        pattern = self.action_patterns.get(command)
        return command if pattern is None else pattern.format(text)

    def enumerable_commands(self, admissible: Sequence[str], task_text: str) -> list[str]:
        """The listed commands as concrete actions, pattern entries filled with the task sentence (what
        constrained decoding chooses among; WebShop's search is the instruction itself)."""
        return [self.fill(command, task_text) for command in admissible]
