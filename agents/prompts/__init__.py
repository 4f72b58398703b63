"""Prompts of the RL papers for ALFWorld and WebShop, and for any text env — one implementation for evaluation
and training.

Public API (what the training loop imports):

* :func:`build_prompt` — chat messages for one step of one trajectory;
* :func:`admissible_actions_from_info` — the env's ``info`` → list of action strings to show (and to project
  onto);
* :func:`task_text_from_observation` — the task sentence from the first observation / reset info;
* the prompt styles by name (:mod:`agents.prompts.registry`): :func:`register_style`, :func:`get_style`,
  :func:`style_names`, :func:`style_name_from_metadata` (an env names its style in
  ``metadata["prompt_style"]``; ``alfworld``, ``webshop`` and the generic ``text`` are registered here);
* :class:`EnvPromptStyle`, :class:`PromptTemplate`;
* :class:`agents.memory.History` keeps the per-trajectory (observation, action) record the prompt shows.

**Length bound.** A prompt is at most ``max_prompt_chars`` long, measured by ``measure`` over the message
contents (characters by default; pass a token counter such as ``lambda s: len(tok(s).input_ids)`` to bound
tokens). verl-agent guards WebShop prompts with one step: above 13 000 characters it falls back to the
no-history template. We keep that as the first step and add further ones, applied in order until the prompt
fits:

1. drop history turns, oldest first (down to the no-history prompt);
2. shorten the admissible-action list (keep its head, say how many are left out);
3. cut the current observation in the middle (keep head and tail, mark the cut with ``[...]``);
4. cut the task sentence the same way.

If the prompt still does not fit (a bound below the template's fixed text), the smallest prompt is returned.

Example:
    >>> from agents.memory import History
    >>> history = History(task_text="put a clean mug in coffeemachine")
    >>> history.record("You are in the middle of a room.", "go to sinkbasin 1")
    >>> messages = build_prompt("alfworld", history.task_text, history, "You arrive at sinkbasin 1.",
    ...                         ["take mug 1 from sinkbasin 1", "help"], history_length=2)
    >>> messages[0]["role"], "'help'" in messages[0]["content"], "step 2" in messages[0]["content"]
    ('user', False, True)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from agents.memory import History, Turn
from agents.prompts import alfworld, generic, webshop  # noqa: F401  (register the package's styles)
from agents.prompts.registry import (
    DEFAULT_STYLE,
    get_style,
    register_style,
    style_name_from_metadata,
    style_names,
)
from agents.prompts.style import EnvPromptStyle
from agents.prompts.templates import PromptParts, render_compact, render_default, render_react

#: verl-agent's WebShop bound (characters) before it drops the history; used for both envs by default.
DEFAULT_MAX_PROMPT_CHARS = 13_000
#: verl-agent's default ``env.history_length``.
DEFAULT_HISTORY_LENGTH = 2


class PromptTemplate(str, enum.Enum):
    """Prompt layout: the RL papers' single message, a multi-turn ReAct-style chat, or a short layout for
    small policies trained from scratch (see :mod:`agents.prompts.templates`)."""

    DEFAULT = "default"
    REACT = "react"
    COMPACT = "compact"


TEMPLATES: dict[PromptTemplate, Callable[[EnvPromptStyle, PromptParts], list[dict[str, str]]]] = {
    PromptTemplate.DEFAULT: render_default,
    PromptTemplate.REACT: render_react,
    PromptTemplate.COMPACT: render_compact,
}


def admissible_actions_from_info(style: str, info: dict[str, Any]) -> list[str]:
    """The actions to list in the prompt of the style named ``style`` (ALFWorld: no ``help``; WebShop:
    ``search[..]``, ``click[..]``)."""
    return get_style(style).admissible_actions(info)


def task_text_from_observation(style: str, observation: str, info: dict[str, Any]) -> str:
    """The task sentence of an episode, from its first observation (or a task entry of the reset info)."""
    return get_style(style).task_text(observation, info)


def _cut_middle(text: str, keep: int) -> str:
    if len(text) <= keep:
        return text
    if keep <= 0:
        return "[...]"
    head = max(keep // 2, 0)
    tail = max(keep - head, 0)
    return text[:head] + " [...] " + (text[-tail:] if tail else "")


def build_prompt(
    style: str,
    task_text: str,
    history: History | Sequence[Turn | tuple[str, str]],
    observation: str,
    admissible_actions: Sequence[str],
    history_length: int = DEFAULT_HISTORY_LENGTH,
    template: PromptTemplate | str = PromptTemplate.DEFAULT,
    *,
    max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS,
    measure: Callable[[str], int] = len,
) -> list[dict[str, str]]:
    """Chat messages (``[{"role", "content"}, ...]``) for the current step of one trajectory.

    Args:
        style: The prompt style's name (``"alfworld"``, ``"webshop"``, ``"text"``, or one registered with
            :func:`register_style`).
        task_text: The task sentence (:func:`task_text_from_observation`).
        history: The steps taken so far (a :class:`History` or ``(observation, action)`` pairs, oldest first;
            raw observations as the env returned them).
        observation: The current raw observation.
        admissible_actions: The actions to list (:func:`admissible_actions_from_info`), of which the style's
            :attr:`~EnvPromptStyle.shown_actions` are shown (ALFWorld's ``help`` is dropped here too).
        history_length: How many of the latest steps to show (0: none).
        template: ``"default"`` (RL papers), ``"react"`` (multi-turn chat) or ``"compact"`` (small policies).
        max_prompt_chars: Bound on ``measure`` summed over the message contents (``None``: unbounded); see the
            module docstring for the fallback order.
        measure: Size of a text (``len`` for characters, or a token counter).
    """
    rules = get_style(style)
    render = TEMPLATES[PromptTemplate(template)]
    turns = (
        history.turns
        if isinstance(history, History)
        else [t if isinstance(t, Turn) else Turn(str(t[0]), str(t[1])) for t in history]
    )
    step_count = len(turns)
    start = max(0, step_count - max(history_length, 0)) if history_length > 0 else step_count
    shown = [
        (start + i + 1, Turn(rules.clean_observation(t.observation, task_text), t.action))
        for i, t in enumerate(turns[start:])
    ]
    admissible = rules.shown_actions(admissible_actions)
    parts = PromptParts(
        task_text, shown, step_count, rules.clean_observation(observation, task_text), admissible
    )

    def size(p: PromptParts) -> int:
        return sum(measure(m["content"]) for m in render(rules, p))

    if max_prompt_chars is None or size(parts) <= max_prompt_chars:
        return render(rules, parts)
    # 1. drop history, oldest first
    while parts.shown and size(parts) > max_prompt_chars:
        parts = PromptParts(parts.task, parts.shown[1:], step_count, parts.observation, parts.admissible)
    # 2. shorten the admissible list (halve until it fits)
    while len(parts.admissible) > 1 and size(parts) > max_prompt_chars:
        keep = len(parts.admissible) // 2
        omitted = parts.omitted_admissible + len(parts.admissible) - keep
        parts = dataclasses.replace(parts, admissible=parts.admissible[:keep], omitted_admissible=omitted)
    # 3./4. cut the observation, then the task, in the middle
    for field in ("observation", "task"):
        for _ in range(32):  # converges in a few rounds; bounded in case ``measure`` is not monotone
            excess = size(parts) - max_prompt_chars
            text = getattr(parts, field)
            if excess <= 0 or not text:
                break
            chars_per_unit = len(text) / max(measure(text), 1)
            keep = max(int(len(text) - (excess + 8) * chars_per_unit) - 1, 0)
            cut = _cut_middle(text, keep)
            if cut == text:
                break
            parts = dataclasses.replace(parts, **{field: cut})
    return render(rules, parts)


__all__ = [
    "DEFAULT_HISTORY_LENGTH",
    "DEFAULT_MAX_PROMPT_CHARS",
    "DEFAULT_STYLE",
    "EnvPromptStyle",
    "PromptTemplate",
    "admissible_actions_from_info",
    "build_prompt",
    "get_style",
    "register_style",
    "style_name_from_metadata",
    "style_names",
    "task_text_from_observation",
]
