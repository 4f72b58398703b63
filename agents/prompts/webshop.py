"""WebShop prompt style (structure of verl-agent ``agent_system/environments/prompts/webshop.py``).

The role line names the WebShop e-commerce environment; admissible actions are ``search[<your query>]`` when
the page has a search bar plus one ``click[<x>]`` per clickable, quoted and comma-separated; the instruction
is moved out of the page text into the task line (verl-agent's ``format_obs`` strips it too). The search entry
is a pattern: a concrete action fills it with a query (``search[{}]``; constrained decoding and the scripted
agents search the instruction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agents.prompts.registry import register_style
from agents.prompts.style import EnvPromptStyle

#: The pattern entry a page with a search bar admits (any non-empty query matches it, see agents.projection).
SEARCH_ACTION = "search[<your query>]"

_INSTRUCTION = re.compile(
    r"Instruction:\s*(?:\[SEP\])?\s*(.+?)\s*(?:\[SEP\]|\n|$)", re.IGNORECASE | re.DOTALL
)


def task_text(observation: str, info: dict[str, Any]) -> str:
    """The shopping instruction (``info["instruction_text"]`` if given, else parsed from the page)."""
    for key in ("instruction_text", "instruction", "task_description", "goal"):
        if isinstance(info.get(key), str) and info[key].strip():
            return info[key].strip()
    match = _INSTRUCTION.search(observation)
    return match.group(1).strip() if match else ""


def format_observation(observation: str, task: str = "") -> str:
    """The page text without the ``WebShop [SEP] Instruction: [SEP] <task> [SEP]`` header."""
    text = observation
    if task:
        index = text.find(task)
        if index >= 0:
            text = text[index + len(task) :]
    return re.sub(r"^\s*(\[SEP\]\s*)+", "", text).strip()


def admissible_actions(info: dict[str, Any]) -> list[str]:
    """``info["available_actions"]`` as action strings (a ``{has_search_bar, clickables}`` dict or a list)."""
    available = info.get("available_actions", info.get("admissible_actions"))
    if available is None:
        return []
    if isinstance(available, dict):
        actions = [SEARCH_ACTION] if available.get("has_search_bar") else []
        return actions + [f"click[{c}]" for c in available.get("clickables", [])]
    return [str(a) for a in available if str(a).strip()]


def format_admissible(actions: Sequence[str]) -> str:
    return ",\n".join(f"'{a}'" for a in actions)


STYLE = register_style(
    EnvPromptStyle(
        name="webshop",
        role="You are an expert autonomous agent operating in the WebShop e-commerce environment.",
        format_admissible=format_admissible,
        format_observation=format_observation,
        task_text=task_text,
        admissible_actions=admissible_actions,
        observation_needs_task=True,
        action_patterns={SEARCH_ACTION: "search[{}]"},
    )
)
