"""The agent protocol: one agent drives a whole batch of env copies.

An agent is told the task of every env slot when episodes start (:meth:`Agent.reset`) and then maps a batch of
observations and infos to a batch of :class:`AgentAction` (:meth:`Agent.act`). Slots whose episode has ended
are masked out with ``active``; the agent returns ``None`` for them and does not advance their memory.

LLM agents share :class:`PromptedAgent`: per slot it keeps a :class:`~agents.memory.History`, builds the
step's prompt with :func:`agents.prompts.build_prompt`, asks a backend for completions
(:meth:`PromptedAgent.generate`), and projects them with :func:`agents.projection.project_action_with_reason`.
It answers in one of two :class:`AnswerMode`\\ s: ``free`` text (the RL papers' setting: the model must write
``<think>..</think><action>..</action>`` itself), or ``guided``: the backend picks one of the step's answers
(:func:`guided_answers`: every admissible action in that format, the candidates of the trainer's constrained
decoding), by the model's own log-probabilities (transformers) or the engine's guided choice (vLLM).

Example:
    >>> from agents.scripted import RandomAgent
    >>> agent = RandomAgent(seed=0)
    >>> agent.reset([Task(env_kind="alfworld", task_index=3, task_id="t3", task_text="look at a book")])
    >>> [a.action for a in agent.act(["You are in a room."], [{"admissible_actions": ["look", "help"]}])]
    ['look']
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agents.memory import History
from agents.projection import InvalidReason, demonstration_text, project_action_with_reason
from agents.prompts import (
    DEFAULT_HISTORY_LENGTH,
    DEFAULT_MAX_PROMPT_CHARS,
    PromptTemplate,
    admissible_actions_from_info,
    build_prompt,
    get_style,
)
from progpo_base.config import documented_field


class AnswerMode(str, enum.Enum):
    """How an LLM agent answers (``progpo eval --mode``)."""

    FREE = "free"  # free text, projected (the RL papers' evaluation)
    GUIDED = "guided"  # one of the step's admissible answers, chosen by the model (:func:`guided_answers`)


def guided_answers(env_kind: str, admissible: Sequence[str], task_text: str) -> list[str]:
    """The answers a guided agent chooses among: each admissible action, pattern entries made concrete as the
    trainer's constrained decoding makes them (:meth:`agents.prompts.EnvPromptStyle.enumerable_commands`:
    WebShop's search is the instruction itself), in the answer format (:func:`demonstration_text`), each once.

    Example:
        >>> guided_answers("alfworld", ["look", "go to desk 1", "look"], "put a mug on the desk")
        ['<think></think><action>look</action>', '<think></think><action>go to desk 1</action>']
    """
    actions = get_style(env_kind).enumerable_commands(admissible, task_text)
    return [demonstration_text(a) for a in dict.fromkeys(actions)]


@dataclasses.dataclass(frozen=True)
class Task:
    """The task an env slot plays in the current episode.

    Attributes:
        env_kind: The env's prompt style, by name (``"alfworld"``, ``"webshop"``, ``"text"``, ...: selects
            prompts and admissible-action parsing; :mod:`agents.prompts.registry`).
        task_index: Index in the split (``reset(options={"task_index": i})``).
        task_id: The env's stable task id.
        task_text: The task sentence.
        task_type: ALFWorld task type (``""`` if none).
        seed: The reset seed of the episode (for agents that sample).
    """

    env_kind: str
    task_index: int
    task_id: str
    task_text: str
    task_type: str = ""
    seed: int = 0


@dataclasses.dataclass
class AgentAction:
    """One decision of an agent for one env slot.

    Attributes:
        action: The string sent to ``env.step``.
        valid: Whether the model's output followed the answer format (always True for scripted agents).
        admissible: Whether ``action`` is in the slot's admissible list (``None`` when unknown).
        reason: Why the output is invalid (:class:`~agents.projection.InvalidReason` value).
        raw_output: The model's text (the action itself for scripted agents).
        prompt: The chat messages sent to the model (``None`` for scripted agents).
        prompt_tokens: Prompt tokens the backend billed for this decision.
        completion_tokens: Completion tokens generated.
        error: Why the agent could not decide (its backend failed: an endpoint that refused the request or
            stayed unreachable); ``None`` for a decision. The rollout loop ends the copy's episode there, and
            evaluation records it as an error, not as a failed episode.
    """

    action: str
    valid: bool = True
    admissible: bool | None = None
    reason: str = InvalidReason.NONE.value
    raw_output: str = ""
    prompt: list[dict[str, str]] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


@runtime_checkable
class Agent(Protocol):
    """What the evaluation harness drives."""

    def reset(self, tasks: Sequence[Task]) -> None:
        """New episodes start: slot ``i`` plays ``tasks[i]``."""

    def act(
        self,
        observations: Sequence[str],
        infos: Sequence[dict[str, Any]],
        active: Sequence[bool] | None = None,
    ) -> list[AgentAction | None]:
        """One action per active slot (``None`` for inactive ones)."""

    def close(self) -> None:
        """Release clients, models, threads."""


def active_mask(active: Sequence[bool] | None, size: int) -> list[bool]:
    """``active`` as a list of ``size`` booleans (all True when ``None``)."""
    if active is None:
        return [True] * size
    if len(active) != size:
        raise ValueError(f"active has {len(active)} entries for {size} slots")
    return [bool(a) for a in active]


#: A chat prompt: its messages, each with a ``role`` and a ``content``.
Chat = list[dict[str, str]]


@dataclasses.dataclass
class Generation:
    """A backend's completion for one prompt, or why there is none (``error``: the request failed)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


@dataclasses.dataclass
class PromptConfig:
    """How an LLM agent prompts and parses (the ``prompt`` section of ``progpo eval``'s config)."""

    history_length: int = documented_field(
        DEFAULT_HISTORY_LENGTH, "latest (observation, action) pairs shown in the prompt"
    )
    template: str = documented_field(
        PromptTemplate.DEFAULT.value,
        "prompt layout: default (the RL papers' single message), react (multi-turn chat) or compact",
        choices=[t.value for t in PromptTemplate],
    )
    max_prompt_chars: int | None = documented_field(
        DEFAULT_MAX_PROMPT_CHARS, "longest prompt in characters (null: unbounded)"
    )
    require_think: bool = documented_field(True, "outputs without <think>..</think> are invalid actions")


class PromptedAgent:
    """Base of LLM agents: per-slot memory, prompts, projection; subclasses implement :meth:`generate`.

    Args:
        prompt_config: Prompt template, history length, length bound.
        mode: :class:`AnswerMode` (guided: :meth:`generate` is given each prompt's answers to choose from).
    """

    def __init__(self, prompt_config: PromptConfig | None = None, mode: str = AnswerMode.FREE.value):
        self.prompt_config = prompt_config or PromptConfig()
        self.mode = AnswerMode(mode)
        self.tasks: list[Task] = []
        self.histories: list[History] = []
        self._pending: list[tuple[str, str] | None] = []

    def reset(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)
        self.histories = [History(task_text=t.task_text) for t in self.tasks]
        self._pending = [None] * len(self.tasks)

    def generate(
        self, prompts: Sequence[Chat], seeds: Sequence[int], choices: Sequence[Sequence[str]] | None = None
    ) -> list[Generation]:
        """Completions for a batch of chat prompts, in order; ``seeds[j]`` is prompt ``j``'s sampling seed.

        With ``choices`` (guided mode) prompt ``j``'s completion is one of ``choices[j]`` (non-empty), chosen
        by the model. A request that fails is a :class:`Generation` with ``error`` set (its slot's episode
        ends as an error), so one failure does not cost the batch's other completions."""
        raise NotImplementedError

    def sampling_seed(self, slot: int) -> int:
        """A 31-bit seed fixed by (task index, episode seed, step): the same however tasks are batched."""
        task = self.tasks[slot]
        entropy = [task.task_index, task.seed, self.histories[slot].num_steps]
        return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)

    def act(
        self,
        observations: Sequence[str],
        infos: Sequence[dict[str, Any]],
        active: Sequence[bool] | None = None,
    ) -> list[AgentAction | None]:
        mask = active_mask(active, len(observations))
        if len(observations) != len(self.tasks):
            raise ValueError(
                f"reset() was given {len(self.tasks)} tasks but act() {len(observations)} observations"
            )
        config = self.prompt_config
        slots, prompts, pools = [], [], []
        for i, (observation, info) in enumerate(zip(observations, infos, strict=True)):
            if not mask[i]:
                continue
            if self._pending[i] is not None:  # the previous step's (observation, action) is now history
                self.histories[i].record(*self._pending[i])
            kind = self.tasks[i].env_kind
            admissible = admissible_actions_from_info(kind, info)
            prompts.append(
                build_prompt(
                    kind,
                    self.tasks[i].task_text,
                    self.histories[i],
                    observation,
                    admissible,
                    config.history_length,
                    config.template,
                    max_prompt_chars=config.max_prompt_chars,
                )
            )
            slots.append(i)
            pools.append(admissible)
        generations = self._generate(prompts, [self.sampling_seed(i) for i in slots], pools, slots)
        if len(generations) != len(prompts):
            raise RuntimeError(f"backend returned {len(generations)} completions for {len(prompts)} prompts")
        out: list[AgentAction | None] = [None] * len(observations)
        for i, prompt, pool, generation in zip(slots, prompts, pools, generations, strict=True):
            if generation.error is not None:
                out[i] = AgentAction("", valid=False, prompt=prompt, error=generation.error)
                continue
            projection = project_action_with_reason(
                generation.text, pool if pool else None, require_think=config.require_think
            )
            out[i] = AgentAction(
                projection.action,
                projection.valid,
                projection.admissible,
                projection.reason.value,
                generation.text,
                prompt,
                generation.prompt_tokens,
                generation.completion_tokens,
            )
            self._pending[i] = (observations[i], projection.action)
        return out

    def _generate(
        self, prompts: list, seeds: list[int], pools: list[list[str]], slots: list[int]
    ) -> list[Generation]:
        """:meth:`generate` in the agent's mode. Guided, a step whose env lists no admissible action has
        nothing to choose from: its slot gets an error (its episode is recorded so) and the rest go on."""
        if not prompts:
            return []
        if self.mode is AnswerMode.FREE:
            return self.generate(prompts, seeds)
        answers = [
            guided_answers(self.tasks[i].env_kind, pool, self.tasks[i].task_text)
            for i, pool in zip(slots, pools, strict=True)
        ]
        asked = [j for j, a in enumerate(answers) if a]
        nothing = "guided mode: the env listed no admissible action at this step"
        out = [Generation("", error=nothing) for _ in prompts]
        chosen = self.generate(
            [prompts[j] for j in asked], [seeds[j] for j in asked], [answers[j] for j in asked]
        )
        for j, generation in zip(asked, chosen, strict=True):
            out[j] = generation
        return out

    def close(self) -> None:
        """Nothing to release by default."""
