"""Agent harness: agents, the prompts and projection shared with training, and evaluation.

What the training loop imports (one implementation for evaluation and training):

* :func:`agents.prompts.build_prompt`, :func:`agents.prompts.admissible_actions_from_info`,
  :func:`agents.prompts.task_text_from_observation`, the prompt styles by name
  (:func:`agents.prompts.register_style`, :func:`agents.prompts.get_style`),
  :class:`agents.prompts.PromptTemplate`;
* :func:`agents.projection.project_action` (``(action, valid)``), :func:`agents.projection.project_actions`
  (batched), :func:`agents.projection.project_action_with_reason`, and its inverse for demonstrations,
  :func:`agents.projection.demonstration_text`;
* :class:`agents.memory.History` (per-trajectory record of (observation, action) pairs).

Agents (:mod:`agents.base` protocol): :class:`agents.openai_agent.OpenAIChatAgent`,
:class:`agents.transformers_agent.TransformersAgent`, :mod:`agents.scripted` (random, expert, human).
The rollout loop evaluation and training share: :func:`agents.rollout.play_episodes`; their envs:
:func:`agents.envs.make_group_envs`. Evaluation:
:func:`agents.evaluate.evaluate` and ``progpo eval`` (:mod:`agents.cli`). Heavy modules (openai, torch) are
imported only by the agents that need them. TRL's ``GRPOTrainer(environment_factory=...)``:
:class:`agents.trl.ALFWorldToolEnv`, :class:`agents.trl.WebShopToolEnv` and :func:`agents.trl.task_rows`.
"""

from agents.base import Agent, AgentAction, PromptConfig, PromptedAgent, Task
from agents.memory import History, Turn
from agents.projection import (
    InvalidReason,
    Projection,
    demonstration_text,
    project_action,
    project_action_with_reason,
    project_actions,
)
from agents.prompts import (
    EnvPromptStyle,
    PromptTemplate,
    admissible_actions_from_info,
    build_prompt,
    get_style,
    register_style,
    task_text_from_observation,
)

__all__ = [
    "Agent",
    "AgentAction",
    "EnvPromptStyle",
    "History",
    "InvalidReason",
    "Projection",
    "PromptConfig",
    "PromptTemplate",
    "PromptedAgent",
    "Task",
    "Turn",
    "admissible_actions_from_info",
    "build_prompt",
    "demonstration_text",
    "get_style",
    "project_action",
    "project_action_with_reason",
    "project_actions",
    "register_style",
    "task_text_from_observation",
]
