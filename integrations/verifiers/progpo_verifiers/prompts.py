"""Our prompt style for ALFWorld and WebShop, and our answer rule, with nothing but the standard library.

The package is installed without the ProGPO suite, so it carries its own copy of the few rules a turn needs;
``tests/agents/test_agents_verifiers_prompts.py`` (in the suite) checks them against ``agents.prompts`` (the
``default`` template with no history shown, the chat holding the history) and ``agents.projection`` on the
same observations and answers, so the two cannot drift apart:

* :func:`turn` — one user turn: the role line and the task, the current observation, every admissible action,
  and the answer format (think in ``<think> </think>``, act in ``<action> </action>``);
* :func:`task_text` — the task sentence from the first observation;
* :func:`parse_answer` — the command an answer plays and whether it is valid: the text of its first
  ``<action>...</action>`` (in the admissible spelling, case and spaces aside); without one the answer is an
  invalid action and the tail of its text is played (the env answers with its "nothing happens").

Example:
    >>> observation = {"text": "You are in the middle of a room.\\nYour task is to: put a mug in desk.",
    ...                "admissible_actions": ["go to desk 1", "help", "look"]}
    >>> task = task_text("alfworld", observation["text"])
    >>> print(turn("alfworld", task, observation).splitlines()[0])
    You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a mug in desk
    >>> parse_answer("<think>go</think><action>Go to desk 1</action>", ["go to desk 1", "look"])
    ('go to desk 1', True)
    >>> parse_answer("go to the desk", ["go to desk 1"])
    ('go to the desk', False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

#: The envs this package plays, and the role line of each (agents.prompts' alfworld and webshop styles).
ROLES = {
    "alfworld": "You are an expert agent operating in the ALFRED Embodied Environment.",
    "webshop": "You are an expert autonomous agent operating in the WebShop e-commerce environment.",
}
TASK_PREFIX = "Your task is to: "
ANSWER_FORMAT = (
    "You should first reason step-by-step about the current situation. "
    "This reasoning process MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for the current step "
    "and present it within <action> </action> tags."
)
#: WebShop's search entry: a pattern any ``search[<query>]`` fills.
SEARCH_ACTION = "search[<your query>]"
#: Characters of an answer's tail played when it has no ``<action>`` block.
FALLBACK_CHARS = 30

_ALFWORLD_TASK = re.compile(r"Your task is to:\s*(.+)")
_WELCOME = re.compile(r"^\s*-= Welcome to TextWorld, ALFRED! =-\s*", re.IGNORECASE)
_WEBSHOP_TASK = re.compile(
    r"Instruction:\s*(?:\[SEP\])?\s*(.+?)\s*(?:\[SEP\]|\n|$)", re.IGNORECASE | re.DOTALL
)
_ACTION = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_SPACES = re.compile(r"\s+")
_PATTERN_ENTRY = re.compile(r"^(\w+)\[<[^>]*>\]$")
_BRACKET_ACTION = re.compile(r"^(\w+)\[(.+)\]$", re.DOTALL)


def _check(env: str) -> None:
    if env not in ROLES:
        raise ValueError(f"env must be one of {', '.join(ROLES)}, got {env!r}")


def task_text(env: str, first_observation: str) -> str:
    """The task sentence: ALFWorld's "Your task is to: ..." line, WebShop's instruction."""
    _check(env)
    if env == "alfworld":
        found = _ALFWORLD_TASK.search(first_observation)
        return found.group(1).strip().rstrip(".") if found else ""
    found = _WEBSHOP_TASK.search(first_observation)
    return found.group(1).strip() if found else ""


def clean_observation(env: str, text: str, task: str) -> str:
    """The observation as a turn shows it: ALFWorld's without TextWorld's banner, WebShop's page without the
    instruction header."""
    _check(env)
    if env == "alfworld":
        return _WELCOME.sub("", text).strip()
    if task and (index := text.find(task)) >= 0:
        text = text[index + len(task) :]
    return re.sub(r"^\s*(\[SEP\]\s*)+", "", text).strip()


def admissible_actions(env: str, observation: Mapping[str, Any]) -> list[str]:
    """The actions a turn lists: ALFWorld's admissible commands without ``help``; WebShop's search pattern
    (with a search bar) and one ``click[...]`` per clickable."""
    _check(env)
    if env == "alfworld":
        actions = observation.get("admissible_actions") or []
        return [str(a) for a in actions if str(a).strip() and str(a).strip().lower() != "help"]
    available = observation.get("available_actions") or {}
    if isinstance(available, Mapping):
        listed = [SEARCH_ACTION] if available.get("has_search_bar") else []
        return listed + [f"click[{c}]" for c in available.get("clickables", [])]
    return [str(a) for a in available if str(a).strip()]


def _listed(env: str, actions: Sequence[str]) -> str:
    if env == "alfworld":
        return "\n ".join(f"'{a}'" for a in actions)
    return ",\n".join(f"'{a}'" for a in actions)


def turn(env: str, task: str, observation: Mapping[str, Any]) -> str:
    """One user turn for ``observation`` (OpenEnv's observation dict of our server: ``text`` and the env's
    actions), every admissible action listed."""
    _check(env)
    lines = [ROLES[env] + (f" {TASK_PREFIX}{task}" if task else "")]
    lines.append(
        f"Your current observation is: {clean_observation(env, str(observation.get('text', '')), task)}"
    )
    actions = _listed(env, admissible_actions(env, observation))
    lines.append(f"Your admissible actions of the current situation are: [\n{actions}\n].")
    lines.append("\nNow it's your turn to take an action.\n" + ANSWER_FORMAT)
    return "\n".join(lines)


def _normalize(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _admissible_spelling(action: str, admissible: Sequence[str]) -> str | None:
    if action in admissible:
        return action
    key = _normalize(action).lower()
    bracket = _BRACKET_ACTION.match(key)
    for candidate in admissible:
        pattern = _PATTERN_ENTRY.match(candidate.strip())
        if pattern:
            if bracket and bracket.group(1) == pattern.group(1).lower() and bracket.group(2).strip():
                return _normalize(action)
        elif _normalize(candidate).lower() == key:
            return candidate
    return None


def parse_answer(text: str, admissible: Sequence[str], require_think: bool = False) -> tuple[str, bool]:
    """``(command, valid)`` for a model's answer (see the module docstring); ``require_think``: an answer
    without ``<think>...</think>`` is invalid too (its action is still played)."""
    text = text if isinstance(text, str) else ""
    blocks = _ACTION.findall(text)
    if not blocks:
        return _normalize(text)[-FALLBACK_CHARS:], False
    action = _normalize(blocks[0])
    action = _admissible_spelling(action, admissible) or action
    valid = len(blocks) == 1 and bool(action) and (not require_think or bool(_THINK.search(text)))
    return action, valid
