"""Projection: model text → (env action, validity), the same function for evaluation and training.

Reproduces the rule of verl-agent's ``env_package/{alfworld,webshop}/projection.py`` (read, not copied):

* the action is the text between ``<action>`` and ``</action>`` (whitespace collapsed, case kept; matched to
  the admissible list case-insensitively so that the env receives the admissible spelling);
* the output is **invalid** when the ``<action>...</action>`` pair is missing, when ``<think>...</think>`` is
  missing (``require_think``), when the text holds letters of another script than Latin (verl-agent checks CJK
  ideographs; we reject any non-Latin letter: CJK, kana, hangul, Cyrillic, ...), when it holds several action
  blocks (verl-agent silently takes the first; an ambiguous answer should not be rewarded) or when the action
  is empty;
* an invalid output is *still played* (verl-agent does the same): the extracted action when there is one, else
  the last ``fallback_chars`` characters of the text, which the env answers with its "nothing happens" text.
  The validity flag is what the invalid-action rate and the training penalty read.

Admissibility is reported separately (``Projection.admissible``): a well-formed answer naming an action that
is not admissible is *valid* (the env decides what it does), as in verl-agent. A WebShop admissible entry such
as ``search[<your query>]`` is a pattern: any non-empty ``search[...]`` matches it.

Example:
    >>> project_action("<think>the mug is here</think><action>Take mug 1 from desk 1</action>",
    ...                ["take mug 1 from desk 1", "look"])
    ('take mug 1 from desk 1', True)
    >>> project_action("take mug 1", ["take mug 1 from desk 1"])
    ('take mug 1', False)
    >>> project_action_with_reason("<think>..</think><action>look</action><action>go</action>").reason
    <InvalidReason.MULTIPLE_ACTIONS: 'multiple_actions'>
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Sequence
from typing import NamedTuple

_ACTION_BLOCK = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_WHITESPACE = re.compile(r"\s+")
_PATTERN_ENTRY = re.compile(r"^(\w+)\[<[^>]*>\]$")  # e.g. "search[<your query>]"
_BRACKET_ACTION = re.compile(r"^(\w+)\[(.+)\]$", re.DOTALL)

#: Characters of the tail of an untagged output that are played (verl-agent uses 30 for ALFWorld).
DEFAULT_FALLBACK_CHARS = 30


class InvalidReason(str, enum.Enum):
    """Why an output is invalid (``NONE`` when it is valid)."""

    NONE = "none"
    MISSING_ACTION_TAG = "missing_action_tag"
    MULTIPLE_ACTIONS = "multiple_actions"
    EMPTY_ACTION = "empty_action"
    MISSING_THINK = "missing_think"
    OTHER_SCRIPT = "other_script"


class Projection(NamedTuple):
    """The result of :func:`project_action_with_reason`.

    Attributes:
        action: What to send to the env (also for invalid outputs).
        valid: Whether the output followed the format (see the module docstring).
        reason: Why it is invalid, ``InvalidReason.NONE`` if valid.
        admissible: Whether ``action`` is in the admissible list; ``None`` when no list was given.
    """

    action: str
    valid: bool
    reason: InvalidReason
    admissible: bool | None


def has_other_script(text: str) -> bool:
    """Whether ``text`` contains a letter of a script other than Latin (e.g. CJK, hangul, Cyrillic)."""
    for char in text:
        if ord(char) < 0x250:  # ASCII and Latin-1/Extended-A/B: fast path
            continue
        if unicodedata.category(char).startswith("L") and not unicodedata.name(char, "").startswith("LATIN"):
            return True
    return False


def _normalize(action: str) -> str:
    return _WHITESPACE.sub(" ", action).strip()


def match_admissible(action: str, admissible_actions: Sequence[str]) -> str | None:
    """The admissible spelling of ``action`` (ignoring case and whitespace), or ``None`` if not admissible.

    Pattern entries like ``search[<your query>]`` match any ``search[...]`` with a non-empty argument; the
    action is then returned as written.
    """
    if action in admissible_actions:  # the common case, without normalising every candidate
        return action
    key = _normalize(action).lower()
    bracket = _BRACKET_ACTION.match(key)
    for candidate in admissible_actions:
        pattern = _PATTERN_ENTRY.match(candidate.strip())
        if pattern:
            if bracket and bracket.group(1) == pattern.group(1).lower() and bracket.group(2).strip():
                return _normalize(action)
        elif _normalize(candidate).lower() == key:
            return candidate
    return None


def project_action_with_reason(
    text: str,
    admissible_actions: Sequence[str] | None = None,
    *,
    require_think: bool = True,
    fallback_chars: int = DEFAULT_FALLBACK_CHARS,
) -> Projection:
    """Turn one model output into the env action, its validity and the reason (module docstring).

    Args:
        text: The model's raw completion.
        admissible_actions: The admissible actions (for the canonical spelling and ``admissible``), or
            ``None``.
        require_think: Whether a ``<think>...</think>`` block is required (True in the RL papers' template;
            the ReAct template asks for it too).
        fallback_chars: Characters of the text's tail played when there is no action block.
    """
    text = text if isinstance(text, str) else ""
    blocks = _ACTION_BLOCK.findall(text)
    if not blocks:
        tail = _normalize(text)[-fallback_chars:] if fallback_chars > 0 else ""
        return Projection(
            tail, False, InvalidReason.MISSING_ACTION_TAG, _admissible(tail, admissible_actions)
        )
    action = _normalize(blocks[0])
    canonical = match_admissible(action, admissible_actions) if admissible_actions is not None else None
    admissible = None if admissible_actions is None else canonical is not None
    if canonical is not None:
        action = canonical
    if len(blocks) > 1:
        reason = InvalidReason.MULTIPLE_ACTIONS
    elif not action:
        reason = InvalidReason.EMPTY_ACTION
    elif require_think and not _THINK_BLOCK.search(text):
        reason = InvalidReason.MISSING_THINK
    elif has_other_script(text):
        reason = InvalidReason.OTHER_SCRIPT
    else:
        reason = InvalidReason.NONE
    return Projection(action, reason is InvalidReason.NONE, reason, admissible)


def _admissible(action: str, admissible_actions: Sequence[str] | None) -> bool | None:
    if admissible_actions is None:
        return None
    return match_admissible(action, admissible_actions) is not None


def project_action(
    text: str,
    admissible_actions: Sequence[str] | None = None,
    *,
    require_think: bool = True,
    fallback_chars: int = DEFAULT_FALLBACK_CHARS,
) -> tuple[str, bool]:
    """``(action, valid)`` for one model output; see :func:`project_action_with_reason` for the arguments."""
    result = project_action_with_reason(
        text, admissible_actions, require_think=require_think, fallback_chars=fallback_chars
    )
    return result.action, result.valid


def demonstration_text(action: str, think: str = "") -> str:
    """The answer an expert step is trained as: a reasoning block, then the action (what
    :func:`project_action_with_reason` parses back to ``(action, valid=True)``).

    The RL papers' format requires a ``<think>`` block (the projection marks answers without one invalid). The
    experts give no reasoning, and a tiny model cannot learn real reasoning from minutes of data, so by
    default the block is empty: the demonstration teaches the format and the action, every response token is
    spent on the action (the tags alone cost ~15 tokens), and nothing pretends to be reasoning.

    Example:
        >>> demonstration_text("go to desk 1")
        '<think></think><action>go to desk 1</action>'
        >>> demonstration_text("go to desk 1", think="the mug may be on the desk")
        '<think>the mug may be on the desk</think><action>go to desk 1</action>'
        >>> project_action(demonstration_text("go to desk 1"), ["go to desk 1"])
        ('go to desk 1', True)
    """
    return f"<think>{think}</think><action>{action}</action>"


def project_actions(
    texts: Sequence[str],
    admissible_actions: Sequence[Sequence[str] | None] | None = None,
    *,
    require_think: bool = True,
) -> tuple[list[str], list[bool]]:
    """Batched :func:`project_action`: ``(actions, valids)`` for one output per env."""
    pools = admissible_actions if admissible_actions is not None else [None] * len(texts)
    if len(pools) != len(texts):
        raise ValueError(f"got {len(texts)} texts but {len(pools)} admissible-action lists")
    results = [project_action(t, p, require_think=require_think) for t, p in zip(texts, pools, strict=True)]
    return [a for a, _ in results], [v for _, v in results]
