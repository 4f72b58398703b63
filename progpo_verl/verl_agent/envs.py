"""Our envs as a verl-agent env package: an env manager with verl-agent's interface (no verl import).

verl-agent's rollout loop talks to an env manager (``agent_system/environments/base.py``,
``EnvironmentManagerBase``): ``reset(kwargs) -> (obs, infos)``, ``step(text_actions) -> (obs, rewards, dones,
infos)`` and ``success_evaluator(total_infos=..., total_batch_list=..., ...)``, where ``obs`` is
``{"text": prompts, "image": None, "anchor": observations}``. :class:`ProGPOEnvManager` is that over one group
vector env of ours (:func:`training.envs.make_split_envs`, the maker ``progpo train`` uses, so the same ids,
kwargs, remote envs and task splits):

* **groups and seeds** as verl-agent's: copy ``i`` of a reset is seeded ``seed + i // n`` (``n`` =
  ``env.rollout.n``, our :class:`~progpo_envs.core.vector.GroupVectorEnv`'s seeding), so a group's copies
  play the same task; the first reset uses ``env.seed`` (validation ``env.seed + 1000``, one copy per task)
  and each later reset draws the next groups' seeds from the vector env's seeded generator (verl-agent's envs
  move on through their seeded game order);
* **prompts** from the harness (:func:`agents.prompts.build_prompt`: the papers' template, the last
  ``env.history_length`` steps, the admissible actions), one user message per copy, as verl-agent's loop
  wraps ``obs["text"]``;
* **projection** :func:`agents.projection.project_action_with_reason`, our reading of verl-agent's rule
  (``<action>`` inside, ``<think>`` required; an invalid output is still played); ``info["is_action_valid"]``
  carries the flag to the rows;
* **anchor** the raw observation, without history or instructions (verl-agent's GiGPO anchor);
* **success** ``info["won"]`` at each trajectory's last active step (``success_rate``), per ALFWorld task type
  (``<type>_success_rate``) and WebShop's mean purchase score, as verl-agent's managers report them.

A copy whose episode ended keeps its last prompt, reward 0 and ``done`` (verl-agent generates for every env
each step and keeps only the active rows).

**Several env servers** (``env.progpo.url`` a list, or URLs separated by commas, with
``env.env_name=progpo/Remote-v0``): the groups spread over them and a lost server's are made again on the
others at the next reset (:mod:`progpo_envs.server.fleet`); an episode in flight on a lost server ends
``done`` with ``info["env_error"]`` (a failed trajectory, not a failed run). ``success_evaluator`` then
also reports ``env_failed_rate`` (the share of trajectories a lost server ended) and each server's share
(``server/<i>/up``, ``server/<i>/groups``, ..., :func:`training.metrics.server_metrics`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agents.base import PromptConfig
from agents.envs import prompt_style, server_status
from agents.memory import History
from agents.projection import project_action_with_reason
from agents.prompts import (
    admissible_actions_from_info,
    build_prompt,
    get_style,
    task_text_from_observation,
)
from progpo_envs.core.vector import reset_per_copy, step_per_copy
from progpo_verl.verl_agent.settings import VAL_SEED_OFFSET, EnvSpec, env_spec_from_config
from training.envs import make_split_envs
from training.metrics import server_metrics

#: verl-agent's name of the mean task score (WebShop's purchase score; any env's ``info["task_score"]``).
WEBSHOP_SCORE_METRIC = "webshop_task_score (not success_rate)"


class ProGPOEnvManager:
    """verl-agent's env-manager interface over a group vector env of ours (see the module docstring).

    Args:
        envs: ``num_groups × group_size`` copies (a :class:`~progpo_envs.core.vector.GroupVectorEnv`).
        kind: The prompt style's name (:mod:`agents.prompts.registry`; the env's own:
            :func:`agents.envs.prompt_style`).
        prompt: History length, template, prompt bound, ``<think>`` requirement.
        seed: The first reset's seed.
    """

    def __init__(self, envs: Any, kind: str, prompt: PromptConfig, seed: int):
        self.envs = envs
        self.kind = get_style(kind).name
        self.prompt = prompt
        self._seed: int | None = int(seed)
        self._observations: list[str] = []
        self._infos: list[dict[str, Any]] = []
        self._histories: list[History] = []
        self._done = np.zeros(envs.num_envs, dtype=bool)

    @property
    def num_envs(self) -> int:
        """Copies stepped together."""
        return int(self.envs.num_envs)

    def _prompt(self, i: int) -> str:
        messages = build_prompt(
            self.kind,
            self._histories[i].task_text,
            self._histories[i],
            self._observations[i],
            admissible_actions_from_info(self.kind, self._infos[i]),
            self.prompt.history_length,
            self.prompt.template,
            max_prompt_chars=self.prompt.max_prompt_chars,
        )
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise ValueError(
                f"template {self.prompt.template!r} makes {len(messages)} messages; verl-agent's loop sends "
                "one user message per step (use the default or compact template)"
            )
        return messages[0]["content"]

    def _observation(self) -> dict[str, Any]:
        return {
            "text": [self._prompt(i) for i in range(self.num_envs)],
            "image": None,
            "anchor": list(self._observations),
        }

    def reset(self, kwargs: Mapping | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Start the next task groups; ``kwargs`` (verl-agent's per-row ``env_kwargs``) must be empty."""
        if kwargs is not None and any(kwargs):
            raise ValueError(f"our envs take no per-reset env_kwargs, got {kwargs!r}")
        observations, infos = reset_per_copy(self.envs, seed=self._seed)
        self._seed = None  # later resets: the vector env's generator, seeded by this first reset
        self._observations, self._infos = list(observations), list(infos)
        self._histories = [
            History(task_text=task_text_from_observation(self.kind, obs, info))
            for obs, info in zip(self._observations, self._infos, strict=True)
        ]
        self._done[:] = False
        return self._observation(), [dict(info) for info in self._infos]

    def step(self, text_actions: Sequence[str]) -> tuple[dict[str, Any], np.ndarray, np.ndarray, list[dict]]:
        """Project every active copy's response, step all copies, and return the next prompts."""
        if len(text_actions) != self.num_envs:
            raise ValueError(f"{len(text_actions)} actions for {self.num_envs} envs")
        actions, valid = [], np.ones(self.num_envs, dtype=bool)
        for i, text in enumerate(text_actions):
            if self._done[i]:
                actions.append("")  # the env latches an ended episode
                continue
            admissible = admissible_actions_from_info(self.kind, self._infos[i])
            projection = project_action_with_reason(
                str(text), admissible or None, require_think=self.prompt.require_think
            )
            actions.append(projection.action)
            valid[i] = projection.valid
            self._histories[i].record(self._observations[i], projection.action)
        observations, rewards, terminated, truncated, infos = step_per_copy(self.envs, actions)
        rewards = np.where(self._done, 0.0, np.asarray(rewards, dtype=np.float32)).astype(np.float32)
        self._done |= np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        self._observations, self._infos = list(observations), list(infos)
        out = [{**info, "is_action_valid": bool(valid[i])} for i, info in enumerate(self._infos)]
        return self._observation(), rewards, self._done.copy(), out

    def success_evaluator(
        self, *, total_infos: Sequence[Sequence[dict]], total_batch_list: Sequence[Sequence[dict]], **_: Any
    ) -> dict[str, np.ndarray]:
        """Success per trajectory from ``info["won"]`` at its last active step, as verl-agent's managers."""
        success: dict[str, list[float]] = defaultdict(list)
        for rows, infos in zip(total_batch_list, total_infos, strict=True):
            last = max(i for i, row in enumerate(rows) if row["active_masks"])
            info = infos[last]
            won = float(bool(info.get("won", False)))
            success["success_rate"].append(won)
            if info.get("task_type"):  # ALFWorld's six types
                success[f"{info['task_type']}_success_rate"].append(won)
            if "task_score" in info:  # WebShop's purchase score
                success[WEBSHOP_SCORE_METRIC].append(float(info["task_score"]))
        servers = server_status(self.envs)
        if servers:  # several env servers: the trajectories a lost one ended, and each one's share
            success["env_failed_rate"] = [
                float("env_error" in infos[max(i for i, row in enumerate(rows) if row["active_masks"])])
                for rows, infos in zip(total_batch_list, total_infos, strict=True)
            ]
            for key, value in server_metrics(servers).items():
                success[key].append(value)
        return {key: np.array(values) for key, values in success.items()}

    def close(self) -> None:
        """Close the copies."""
        self.envs.close()


def env_managers(spec: EnvSpec) -> tuple[ProGPOEnvManager, ProGPOEnvManager]:
    """The training and validation managers of ``spec`` (verl-agent's ``make_envs`` pair)."""
    train = make_split_envs(spec.env, spec.env.train_split, spec.train_groups, spec.group_size)
    try:
        kind = prompt_style(train)  # the env played names it (the hosted one for progpo/Remote-v0)
        val = make_split_envs(spec.env, spec.env.eval_split, spec.val_groups, 1)
    except BaseException:
        train.close()
        raise
    return (
        ProGPOEnvManager(train, kind, spec.prompt, spec.seed),
        ProGPOEnvManager(val, kind, spec.prompt, spec.seed + VAL_SEED_OFFSET),
    )


def make_progpo_envs(config: Mapping) -> tuple[ProGPOEnvManager, ProGPOEnvManager]:
    """verl-agent's ``make_envs(config)`` for a ``progpo/*`` ``env.env_name``."""
    spec = env_spec_from_config(config)
    if spec is None:
        raise ValueError(f"env.env_name={config['env']['env_name']!r} is not one of ours (progpo/*)")
    return env_managers(spec)
