"""ALFWorld and WebShop as a verifiers taskset, on top of verifiers' own OpenEnv taskset.

The tasks are the server's task indices: task ``t`` of the split is one verifiers task whose OpenEnv reset is
``{"task_index": t, "seed": seed + t, "split": split}`` (``progpo eval --seed`` resets task ``t`` the same
way), so every rollout of a group (``-r``/``--num-rollouts``) plays the same task from the same first
observation. verifiers' own taskset resets with ``{}`` by default: a random task for every rollout.

The config and task data are verifiers' OpenEnv taskset's (``base_url``, the reset arguments), extended. The
env (:class:`ProgpoEnv`) plays one episode per rollout through OpenEnv's ``GenericEnvClient`` as verifiers'
``OpenEnvEnv`` does, but in our
prompt style (:mod:`progpo_verifiers.prompts`: each user turn lists every admissible action and asks for
``<think>``/``<action>``; verifiers' dumps the observation's JSON) and with our answer rule (the text of the
``<action>`` block; an answer without one is an invalid action, played and counted, never an error). The
server's observations never hold the expert's command, so nothing a turn shows gives the answer away.

Scores (on each trace): the reward ``success`` (1.0 when the task is solved); the metrics ``task_score``
(WebShop's 0-1 purchase score, ALFWorld's 1.0 on a win), ``env_return`` (the env's summed rewards), ``steps``
and ``invalid_actions``.

Its seat (``player``) defaults to verifiers' ``null`` harness in a ``subprocess`` runtime: a plain chat with
the model, run on this machine (verifiers' default runtime is Prime's cloud).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import httpx
import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.harnesses.null import NullHarnessConfig
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.tasksets.openenv import OpenEnvConfig, OpenEnvData

from progpo_verifiers import prompts


class ProgpoConfig(OpenEnvConfig):
    """The taskset's knobs (``[env.taskset]``); ``base_url`` (verifiers' own) names the server."""

    env_kind: Literal["alfworld", "webshop"] = "alfworld"
    """Which env the server at ``base_url`` hosts: its prompt style."""
    split: str = "train"
    """The split played (``progpo serve`` may fix one; then name that one)."""
    seed: int = 0
    """Base seed: task ``t`` is reset with ``seed + t``."""
    task_indices: list[int] | None = None
    """The tasks, in order (None: every task of the split, as the server counts them)."""
    require_think: bool = False
    """An answer without ``<think>...</think>`` counts as invalid too (its action is still played)."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds one call to the server may take."""


class ProgpoData(OpenEnvData):
    """One task: the reset arguments and what the env needs to play it."""

    env_kind: str
    task_index: int
    require_think: bool
    timeout_s: float


class ProgpoTask(vf.Task[ProgpoData]):
    """One task of the split (scored by :class:`ProgpoEnv` on the trace)."""


class ProgpoEnvConfig(vf.EnvConfig):
    """The env's one seat, run on this machine by default."""

    player: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig())


def _num_tasks(base_url: str, split: str, timeout_s: float) -> int:
    """Tasks in ``split``: one stateless reset of task 0 over OpenEnv's HTTP ``/reset``."""
    url = base_url.rstrip("/").replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    answer = httpx.post(f"{url}/reset", json={"task_index": 0, "split": split}, timeout=timeout_s)
    answer.raise_for_status()
    return int(answer.json()["observation"]["num_tasks"])


class ProgpoTaskset(vf.Taskset[ProgpoTask, ProgpoConfig]):
    """The split's tasks (see the module docstring)."""

    def load(self) -> Iterator[ProgpoTask]:
        config = self.config
        if not config.base_url:
            raise ValueError("set env.taskset.base_url to the server (`progpo serve --protocol openenv`)")
        indices = config.task_indices
        if indices is None:
            indices = list(range(_num_tasks(config.base_url, config.split, config.timeout_s)))
        for task_index in indices:
            yield ProgpoTask(
                ProgpoData(
                    name=f"{config.env_kind}/{config.split}#{task_index}",
                    id=f"{config.env_kind}/{config.split}/{task_index}",
                    prompt=None,
                    env=None,
                    base_url=config.base_url,
                    use_docker=False,
                    provider_kwargs={},
                    reset={"task_index": task_index, "seed": config.seed + task_index, "split": config.split},
                    env_kind=config.env_kind,
                    task_index=task_index,
                    require_think=config.require_think,
                    timeout_s=config.timeout_s,
                ),
                config.task,
            )


class ProgpoEnv(vf.Env[ProgpoEnvConfig]):
    """One episode per rollout in our prompt style (see the module docstring)."""

    async def run(self, task, agents):
        from openenv import GenericEnvClient

        data = task.data
        kind = data.env_kind
        steps = invalid = 0
        env_return = 0.0
        async with GenericEnvClient(base_url=data.base_url, message_timeout_s=data.timeout_s) as client:
            result = await client.reset(**data.reset)
            observation = result.observation
            task_sentence = prompts.task_text(kind, observation["text"])
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn(prompts.turn(kind, task_sentence, observation))
                while not segment.terminated:
                    admissible = prompts.admissible_actions(kind, observation)
                    command, valid = prompts.parse_answer(segment.last_reply, admissible, data.require_think)
                    invalid += not valid
                    result = await client.step({"command": command})
                    steps += 1
                    env_return += result.reward or 0.0
                    observation = result.observation
                    if result.done:
                        break
                    segment = await interaction.turn(prompts.turn(kind, task_sentence, observation))
                # scored before the exchange closes, so the rollout's reward (logged, trained on) holds it
                won = bool(observation.get("won", False))
                interaction.trace.record_reward("success", float(won))
                interaction.trace.record_metrics(
                    {
                        "task_score": float(observation.get("task_score", 1.0 if won else 0.0)),
                        "env_return": env_return,
                        "steps": float(steps),
                        "invalid_actions": float(invalid),
                    }
                )
                interaction.trace.info["task_index"] = data.task_index
