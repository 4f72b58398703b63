"""The three prompt templates, shared by every env (the env supplies an :class:`EnvPromptStyle`).

* ``default`` — the RL papers' single user message (verl-agent ``*_TEMPLATE`` / ``*_TEMPLATE_NO_HIS``, GiGPO
  §4): role + task, "Prior to this step you have taken N step(s)" with the last ``history_length``
  observations and actions, the current step and observation, the admissible actions, and the instruction to
  reason inside ``<think> </think>`` and answer inside ``<action> </action>``. With no history to show (first
  step or ``history_length=0``) the history sentence is left out. Unlike verl-agent's no-history template, the
  task line is always kept: later observations do not repeat it.
* ``react`` — a multi-turn chat in the spirit of ReAct (Yao et al., 2023): a system message with the role,
  task and answer format; then one user turn per shown past observation and one assistant turn with the action
  taken (``<action>..</action>``); the last user turn has the current observation and admissible actions. The
  model thinks, then acts, every turn; the projection is the same.
* ``compact`` — for small policies trained from scratch (the CPU quickstart): no instructions, the shown
  history one line a step, the current observation, the admissible actions on one line, and the task *last*,
  right before the answer. A randomly initialised model has to learn to find the task's words among all the
  prompt's tokens; in the papers' ~450-token layout a 2-layer model did not learn to read even a one-digit
  task from expert demonstrations (measured on the training tests' toy env), so this layout keeps the prompt
  short and the task nearest to the decision. The answer format is unchanged.

Every template is a pure function ``(style, PromptParts) -> list[{"role", "content"}]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agents.memory import Turn
from agents.prompts.style import EnvPromptStyle

ANSWER_FORMAT = (
    "You should first reason step-by-step about the current situation. "
    "This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for the current step "
    "and present "
    "it within <action> </action> tags."
)


@dataclasses.dataclass(frozen=True)
class PromptParts:
    """Everything a template shows, already cleaned and cut to size.

    Attributes:
        task: The task sentence.
        shown: ``(step number, turn)`` pairs of history to show, oldest first (observations cleaned).
        step_count: Steps taken before this one (all of them, also those not shown).
        observation: The current observation (cleaned).
        admissible: The admissible actions to list.
        omitted_admissible: How many admissible actions were cut from the list to fit the length bound.
    """

    task: str
    shown: Sequence[tuple[int, Turn]]
    step_count: int
    observation: str
    admissible: Sequence[str]
    omitted_admissible: int = 0


def _admissible_block(style: EnvPromptStyle, parts: PromptParts) -> str:
    listed = style.format_admissible(parts.admissible)
    if parts.omitted_admissible:
        listed += f"\n (... {parts.omitted_admissible} more not shown)"
    return f"Your admissible actions of the current situation are: [\n{listed}\n]."


def render_default(style: EnvPromptStyle, parts: PromptParts) -> list[dict[str, str]]:
    lines = [style.role + (f" {style.task_prefix}{parts.task}" if parts.task else "")]
    if parts.shown:
        history = "\n".join(
            f"[Observation {n}: '{turn.observation}', Action {n}: '{turn.action}']" for n, turn in parts.shown
        )
        lines.append(
            f"Prior to this step, you have already taken {parts.step_count} step(s). "
            "Below are the most recent "
            f"{len(parts.shown)} observations and the corresponding actions you took:\n{history}"
        )
        lines.append(
            f"You are now at step {parts.step_count + 1} and your current observation is: {parts.observation}"
        )
    else:
        lines.append(f"Your current observation is: {parts.observation}")
    lines.append(_admissible_block(style, parts))
    lines.append("\nNow it's your turn to take an action.\n" + ANSWER_FORMAT)
    return [{"role": "user", "content": "\n".join(lines)}]


def render_react(style: EnvPromptStyle, parts: PromptParts) -> list[dict[str, str]]:
    system = style.role + (f"\n{style.task_prefix}{parts.task}" if parts.task else "")
    system += (
        "\nEach turn you see an observation and the admissible actions. Think, then act: "
        "write your thoughts inside <think> </think> tags and then exactly one admissible action inside "
        "<action> </action> tags."
    )
    if parts.shown and parts.shown[0][0] > 1:
        system += f"\n(The first {parts.shown[0][0] - 1} step(s) of this episode are not shown.)"
    elif not parts.shown and parts.step_count:
        system += f"\n(You have already taken {parts.step_count} step(s); they are not shown.)"
    messages = [{"role": "system", "content": system}]
    for n, turn in parts.shown:
        messages.append({"role": "user", "content": f"Step {n}. Observation: {turn.observation}"})
        messages.append({"role": "assistant", "content": f"<action>{turn.action}</action>"})
    messages.append(
        {
            "role": "user",
            "content": f"Step {parts.step_count + 1}. Observation: {parts.observation}\n"
            f"{_admissible_block(style, parts)}\n{ANSWER_FORMAT}",
        }
    )
    return messages


def render_compact(style: EnvPromptStyle, parts: PromptParts) -> list[dict[str, str]]:
    lines = [f"Step {n}: {turn.observation} > {turn.action}" for n, turn in parts.shown]
    lines.append(f"Step {parts.step_count + 1}: {parts.observation}")
    listed = " | ".join(parts.admissible)
    if parts.omitted_admissible:
        listed += f" | (... {parts.omitted_admissible} more not shown)"
    lines.append(f"Actions: {listed}")
    lines.append(f"Task: {parts.task}")
    return [{"role": "user", "content": "\n".join(lines)}]
