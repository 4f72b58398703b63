"""Group rollouts: B task groups × G copies played to the end, one step row per (trajectory, step).

Each step, every still-active copy gets a *step-independent* prompt (verl-agent's design): the task, the last
``history_length`` (observation, action) pairs and the current observation with its admissible actions, built
by the agent harness (:func:`agents.prompts.build_prompt`; the same prompt ``progpo eval`` shows). The prompts
of all active copies are sampled together by a generation engine, the texts go through the harness's
projection (:func:`agents.projection.project_action`) to (action, valid), and the vector env steps all copies
at once.

A step row keeps what the update needs (prompt ids, response ids, the log-probs recorded at sampling) and what
the estimators group by, read from ``info`` — never parsed from the text: ``obs_key`` is the env's
``obs_hash`` of the observation the action was taken in, ``action_key`` the xxh3 key of the action played
(:func:`progpo_envs.core.hashing.text_digest`), and ``history_key`` the exact-prefix key (for the
"exact-prefix peer" metric).

Example:
    >>> rows = StepRows.empty()
    >>> rows.num_rows
    0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from agents.memory import History
from agents.projection import project_action_with_reason
from agents.prompts import (
    admissible_actions_from_info,
    build_prompt,
    env_kind_from_id,
    task_text_from_observation,
)
from progpo_envs.core.hashing import text_digest
from training.constrained import enumerable_commands
from training.sampling import SampleOutput, sample_responses

#: info entries copied per copy from the vector env's dict of arrays.
_INFO_KEYS = (
    "admissible_actions",
    "available_actions",
    "obs_hash",
    "history_key",
    "won",
    "task_score",
    "task_type",
    "task_id",
    "expert_action",
    "task_description",
    "instruction_text",
)


class GenerationEngine(Protocol):
    """What rollouts need from a sampler (transformers in-process, or vLLM)."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None,
        candidates: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> SampleOutput:
        """One sampled response per prompt, with per-token log-probs (constrained to ``candidates`` per
        prompt when given: :mod:`training.constrained`)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trainer's current weights (no-op when the engine *is* the trainer's model)."""


class TransformersEngine:
    """Samples with a transformers model in this process (the trainer's own model, or a rollout copy).

    Args:
        model: The causal LM to sample from.
        stop_token_ids: Tokens that end a response.
        pad_token_id: Padding id.
        top_p: Nucleus threshold.
        batch_size: Sequences decoded together.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        top_p: float = 1.0,
        batch_size: int = 64,
    ):
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.top_p = top_p
        self.batch_size = batch_size

    def generate(self, prompts, *, temperature, max_new_tokens, generator, candidates=None):
        """See :class:`GenerationEngine`."""
        was_training = self.model.training
        self.model.eval()
        try:
            return sample_responses(
                self.model,
                prompts,
                max_new_tokens=max_new_tokens,
                stop_token_ids=self.stop_token_ids,
                pad_token_id=self.pad_token_id,
                temperature=temperature,
                top_p=self.top_p,
                generator=generator,
                batch_size=self.batch_size,
                candidates=candidates,
            )
        finally:
            self.model.train(was_training)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s weights unless it is this engine's model already."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())


@dataclasses.dataclass
class StepRows:
    """Columnar step rows (one per trajectory × step), in play order.

    Attributes:
        prompt_ids, response_ids, old_logprobs: Token-level data of each row.
        group_id, traj_id, step, reward, won, valid, obs_key, action_key: The estimator columns.
        admissible: Whether the action played was in the admissible list (reported, not used by estimators).
        history_key: Exact-prefix key of the state (uint64).
        obs_text: Raw observation the action was taken in.
        action_text: The action played.
        choices: With constrained decoding, the candidate responses (token ids) the response was drawn from;
            empty for free-text rows.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: list[list[float]]
    group_id: list[int]
    traj_id: list[int]
    step: list[int]
    reward: list[float]
    won: list[bool]
    valid: list[bool]
    admissible: list[bool]
    obs_key: list[int]
    action_key: list[int]
    history_key: list[int]
    obs_text: list[str]
    action_text: list[str]
    choices: list[list[list[int]]]

    @classmethod
    def empty(cls) -> StepRows:
        """No rows."""
        return cls(**{f.name: [] for f in dataclasses.fields(cls)})

    @property
    def num_rows(self) -> int:
        """Number of step rows."""
        return len(self.group_id)

    def extend(self, other: StepRows) -> None:
        """Append ``other``'s rows."""
        for f in dataclasses.fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))

    def select(self, indices: Sequence[int]) -> StepRows:
        """The rows at ``indices``."""
        return StepRows(
            **{f.name: [getattr(self, f.name)[i] for i in indices] for f in dataclasses.fields(self)}
        )

    def estimator_columns(self) -> dict[str, np.ndarray]:
        """The columns :func:`training.advantages.compute_advantages` takes."""
        return {
            "group_id": np.asarray(self.group_id, dtype=np.int64),
            "traj_id": np.asarray(self.traj_id, dtype=np.int64),
            "step": np.asarray(self.step, dtype=np.int64),
            "reward": np.asarray(self.reward, dtype=np.float64),
            "won": np.asarray(self.won, dtype=bool),
            "valid": np.asarray(self.valid, dtype=bool),
            "obs_key": np.asarray(self.obs_key, dtype=np.uint64),
            "action_key": np.asarray(self.action_key, dtype=np.uint64),
            "obs_text": np.asarray(self.obs_text, dtype=object),
        }


@dataclasses.dataclass
class Episode:
    """Outcome of one trajectory."""

    group_id: int
    traj_id: int
    task_id: str
    task_type: str
    won: bool
    score: float
    steps: int
    invalid_steps: int
    #: The env's own task score at the end when it reports one (WebShop's 0–1 purchase score), else None.
    task_score: float | None = None


@dataclasses.dataclass
class RolloutResult:
    """Rows, episodes and counters of one rollout."""

    rows: StepRows
    episodes: list[Episode]
    generated_tokens: int = 0
    prompt_tokens: int = 0
    env_steps: int = 0
    sample_seconds: float = 0.0
    env_seconds: float = 0.0


def info_for(info: dict[str, Any], index: int) -> dict[str, Any]:
    """The info entries of copy ``index`` from a vector env's dict of arrays (respecting ``_key`` masks;
    nested dicts, such as WebShop's ``available_actions``, are taken apart the same way)."""
    return _entries_for(info, index, _INFO_KEYS)


def _entries_for(info: dict[str, Any], index: int, keys) -> dict[str, Any]:
    out = {}
    for key in keys:
        if key in info:
            mask = info.get("_" + key)
            if mask is None or bool(mask[index]):
                value = info[key]
                if isinstance(value, dict):
                    out[key] = _entries_for(value, index, [k for k in value if not k.startswith("_")])
                    continue
                value = value[index]
                out[key] = (
                    value.tolist() if isinstance(value, np.ndarray) and value.dtype == object else value
                )
    return out


def response_token_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a response ``text`` as the policy writes it: followed by the end-of-turn token."""
    return tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]


class PromptEncoder:
    """Chat messages -> prompt token ids (the tokenizer's chat template); over-long prompts keep their tail.

    Args:
        tokenizer: A tokenizer with a chat template.
        max_prompt_tokens: Longest prompt; longer ones keep the last ``max_prompt_tokens`` tokens (the current
            observation, the admissible actions and the answer format are at the end).
    """

    def __init__(self, tokenizer, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens

    def __call__(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` followed by the assistant generation prompt."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens :]


class RolloutWorker:
    """Plays groups of episodes in a group vector env with a generation engine (or a scripted actor).

    Args:
        envs: A :class:`progpo_envs.core.vector.GroupVectorEnv` (``num_envs = B·G``).
        env_id: Its id (picks the prompt style: ALFWorld or WebShop).
        tokenizer: The policy's tokenizer.
        history_length: Past (observation, action) pairs shown in each prompt.
        max_prompt_tokens: Prompt length bound (see :class:`PromptEncoder`).
        template: Harness prompt template (:class:`agents.prompts.PromptTemplate`).
        constrained_actions: Sample only admissible actions in the answer format
            (:mod:`training.constrained`).
    """

    def __init__(
        self,
        envs,
        env_id: str,
        tokenizer,
        history_length: int,
        max_prompt_tokens: int,
        template: str = "default",
        constrained_actions: bool = False,
    ):
        self.envs = envs
        self.env_kind = env_kind_from_id(env_id)
        self.tokenizer = tokenizer
        self.history_length = history_length
        self.encode = PromptEncoder(tokenizer, max_prompt_tokens)
        self.template = template
        self.constrained_actions = constrained_actions
        self._answer_ids: dict[str, list[int]] = {}

    def answer_ids(self, action: str) -> list[int]:
        """Token ids of ``action`` in the answer format, ending with the end-of-turn token (cached)."""
        ids = self._answer_ids.get(action)
        if ids is None:
            from training.warm_start import demonstration_text  # the one answer format (import cycle)

            ids = self._answer_ids[action] = response_token_ids(self.tokenizer, demonstration_text(action))
        return ids

    def run(
        self,
        *,
        seed: int,
        task_indices: Sequence[int] | None = None,
        engine: GenerationEngine | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 32,
        generator: torch.Generator | None = None,
        scripted: Callable[[dict[str, Any]], str] | None = None,
        group_offset: int = 0,
        traj_offset: int = 0,
    ) -> RolloutResult:
        """Play one episode per copy until every copy is done.

        Args:
            seed: Reset seed (copies of a group share it).
            task_indices: One task index per group (else the seed picks).
            engine: Samples the policy's responses.
            temperature: Sampling temperature.
            max_new_tokens: Response length limit.
            generator: Torch generator for reproducible sampling.
            scripted: Instead of ``engine``: ``info -> response text`` (e.g. the expert formatted as an
                answer); its rows carry empty log-probs.
            group_offset: Added to group ids (distinct ids across ranks and rounds).
            traj_offset: Added to trajectory ids.
        """
        import time

        envs = self.envs
        num_envs, group_size = envs.num_envs, envs.group_size
        options = {"task_indices": list(task_indices)} if task_indices is not None else None
        obs, info = envs.reset(seed=seed, options=options)
        infos = [info_for(info, i) for i in range(num_envs)]
        histories = [
            History(task_text=task_text_from_observation(self.env_kind, obs[i], infos[i]))
            for i in range(num_envs)
        ]
        active = np.ones(num_envs, dtype=bool)
        rows = StepRows.empty()
        result = RolloutResult(rows, [])
        invalid_counts = np.zeros(num_envs, dtype=int)
        scores = np.zeros(num_envs)
        while active.any():
            index = np.flatnonzero(active)
            admissible = [admissible_actions_from_info(self.env_kind, infos[i]) for i in index]
            prompts = [
                self.encode(
                    build_prompt(
                        self.env_kind,
                        histories[i].task_text,
                        histories[i],
                        obs[i],
                        adm,
                        history_length=self.history_length,
                        template=self.template,
                    )
                )
                for i, adm in zip(index, admissible, strict=True)
            ]
            choices = (
                [
                    [self.answer_ids(a) for a in enumerable_commands(adm, histories[i].task_text)]
                    for i, adm in zip(index, admissible, strict=True)
                ]
                if self.constrained_actions
                else [[] for _ in index]
            )
            started = time.perf_counter()
            if scripted is not None:
                texts = [scripted(infos[i]) for i in index]
                responses = [response_token_ids(self.tokenizer, t) for t in texts]
                for options, response in zip(choices, responses, strict=True):
                    if self.constrained_actions and response not in options:
                        options.append(response)  # a demonstration outside the list stays learnable
                logprobs = [[] for _ in index]
            else:
                sampled = engine.generate(
                    prompts,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    generator=generator,
                    candidates=choices if self.constrained_actions else None,
                )
                responses, logprobs = sampled.token_ids, sampled.logprobs
                texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
            result.sample_seconds += time.perf_counter() - started
            actions = [""] * num_envs  # ended copies ignore their action (the env latches their final step)
            valids, admissibles = {}, {}
            for i, text, adm in zip(index, texts, admissible, strict=True):
                projection = project_action_with_reason(text, adm)
                actions[i], valids[i] = projection.action, projection.valid
                admissibles[i] = bool(projection.admissible)
            started = time.perf_counter()
            next_obs, rewards, terminated, truncated, next_info = envs.step(actions)
            result.env_seconds += time.perf_counter() - started
            next_infos = [info_for(next_info, i) for i in range(num_envs)]
            for k, i in enumerate(index):
                rows.prompt_ids.append(prompts[k])
                rows.response_ids.append(list(responses[k]))
                rows.old_logprobs.append(list(logprobs[k]))
                rows.group_id.append(group_offset + i // group_size)
                rows.traj_id.append(traj_offset + i)
                rows.step.append(histories[i].num_steps)
                rows.reward.append(float(rewards[i]))
                rows.won.append(bool(next_infos[i].get("won", False)))
                rows.valid.append(bool(valids[i]))
                rows.admissible.append(admissibles[i])
                rows.obs_key.append(int(infos[i]["obs_hash"]))
                rows.action_key.append(int(text_digest(actions[i])))
                rows.history_key.append(int(infos[i].get("history_key", 0)))
                rows.obs_text.append(obs[i])
                rows.action_text.append(actions[i])
                rows.choices.append(choices[k])
                result.prompt_tokens += len(prompts[k])
                result.generated_tokens += len(responses[k])
                result.env_steps += 1
                histories[i].record(obs[i], actions[i])
                invalid_counts[i] += not valids[i]
                scores[i] += float(rewards[i])
                if terminated[i] or truncated[i]:
                    active[i] = False
                    result.episodes.append(
                        Episode(
                            group_id=group_offset + i // group_size,
                            traj_id=traj_offset + i,
                            task_id=str(infos[i].get("task_id", "")),
                            task_type=str(infos[i].get("task_type", "")),
                            won=bool(next_infos[i].get("won", False)),
                            score=float(scores[i]),
                            steps=histories[i].num_steps,
                            invalid_steps=int(invalid_counts[i]),
                            task_score=(
                                float(next_infos[i]["task_score"]) if "task_score" in next_infos[i] else None
                            ),
                        )
                    )
            obs, infos = next_obs, next_infos
        result.episodes.sort(key=lambda e: e.traj_id)
        return result
