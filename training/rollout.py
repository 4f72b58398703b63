"""Group rollouts: B task groups × G copies played to the end, one step row per (trajectory, step).

The episodes are played by the harness's rollout loop (:func:`agents.rollout.play_episodes`, the loop
``progpo eval`` uses) with the training policy as its agent (:class:`PolicyAgent`). Each step, every
still-active copy gets a *step-independent* prompt (verl-agent's design): the task, the last
``history_length`` (observation, action) pairs and the current observation with its admissible actions, built
by the agent harness (:func:`agents.prompts.build_prompt`; the same prompt ``progpo eval`` shows). The prompts
of all active copies are sampled together by a generation engine (:mod:`training.engines`), the texts go
through the harness's projection (:func:`agents.projection.project_action_with_reason`) to (action, valid),
and the vector env steps all copies at once.

A step row keeps what the update needs (prompt ids, response ids, the log-probs recorded at sampling) and what
the estimators group by, read from ``info`` — never parsed from the text: ``obs_key`` is the env's
``obs_hash`` of the observation the action was taken in, ``action_key`` the xxh3 key of the action played
(:func:`progpo_envs.core.hashing.text_digest`), ``admissible_key`` the key of the set of admissible actions
in that state (``info["admissible_actions"]``, :func:`progpo_envs.core.hashing.action_set_key`; the graph
estimators' ``state_key="observation_actions"``), and ``history_key`` the exact-prefix key (for the
"exact-prefix peer" metric).

Example:
    >>> rows = StepRows.empty()
    >>> rows.num_rows
    0
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agents.base import AgentAction, Task, active_mask
from agents.envs import num_tasks, prompt_style, spread_tasks
from agents.memory import History
from agents.projection import demonstration_text, project_action_with_reason
from agents.prompts import admissible_actions_from_info, build_prompt, get_style
from agents.rollout import Transition, play_episodes
from progpo_envs.core.hashing import action_set_key, text_digest
from training.config import TrainConfig
from training.distributed import DistContext
from training.engines import GenerationEngine
from training.envs import make_split_envs
from training.seeds import derive_seed, request_seed


@dataclasses.dataclass
class StepRows:
    """Columnar step rows (one per trajectory × step), in play order.

    Attributes:
        prompt_ids, response_ids, old_logprobs: Token-level data of each row.
        group_id, traj_id, step, reward, won, valid, obs_key, action_key: The estimator columns.
        admissible: Whether the action played was in the admissible list (reported, not used by estimators).
        admissible_key: Key of the state's set of admissible actions (uint64; the empty set's key when the
            env's info lists none), the estimator column ``admissible_key``.
        history_key: Exact-prefix key of the state (uint64).
        obs_text: Raw observation the action was taken in.
        action_text: The action played.
        choices: With constrained decoding, the candidate responses (token ids) the response was drawn from;
            empty for free-text rows.
        policy_version: The version of the weights that sampled the row (updates applied to them: the
            iteration it was sampled for in lock step; with asynchronous rollouts, up to
            ``rollout.max_staleness`` behind the iteration that trains on it).
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
    admissible_key: list[int]
    history_key: list[int]
    obs_text: list[str]
    action_text: list[str]
    choices: list[list[list[int]]]
    policy_version: list[int]

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
            "admissible_key": np.asarray(self.admissible_key, dtype=np.uint64),
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
    #: Why the env ended it when its env server was lost under it (``info["env_error"]``), else None: an
    #: infrastructure fault, not the policy's failure. Its whole group is left out of the advantages, the
    #: loss and the success metrics (:meth:`RolloutResult.env_failed_groups`); it is counted apart
    #: (``env_failed_episodes``).
    env_error: str | None = None


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
    #: Groups rolled out and left out of the batch (dynamic sampling's uniform-outcome groups).
    groups_dropped: int = 0

    def env_failed_groups(self) -> set[int]:
        """The groups an env failure cut short: one of their episodes ended because its env server was lost
        (:attr:`Episode.env_error`).

        Such a group is dropped whole, its episodes that ended before the failure too: a group-relative
        baseline over the copies left would compare them with a different set of peers (and those that
        ended first are the short episodes, won more often), and the reward 0 of the cut episodes would
        push their actions down for a fault that was not theirs.
        """
        return {e.group_id for e in self.episodes if e.env_error is not None}

    def env_failed_rows(self) -> np.ndarray:
        """Bool per row: the rows of :meth:`env_failed_groups` (all False in a run without env failures)."""
        lost = self.env_failed_groups()
        return np.fromiter((g in lost for g in self.rows.group_id), dtype=bool, count=self.rows.num_rows)

    def add(self, other: RolloutResult, groups: set[int] | None = None) -> None:
        """Append ``other``'s rows and episodes (only those of ``groups`` when given, and every episode a lost
        env server ended, which the metrics count) and add its counters."""
        if groups is None:
            self.rows.extend(other.rows)
            self.episodes.extend(other.episodes)
        else:
            self.rows.extend(other.rows.select([i for i, g in enumerate(other.rows.group_id) if g in groups]))
            self.episodes.extend(e for e in other.episodes if e.group_id in groups or e.env_error is not None)
        self.generated_tokens += other.generated_tokens
        self.prompt_tokens += other.prompt_tokens
        self.env_steps += other.env_steps
        self.sample_seconds += other.sample_seconds
        self.env_seconds += other.env_seconds
        self.groups_dropped += other.groups_dropped


def response_token_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a response ``text`` as the policy writes it: followed by the end-of-turn token."""
    return tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]


class PromptEncoder:
    """Chat messages -> prompt token ids (the tokenizer's chat template), at most ``max_prompt_tokens``.

    A prompt over the bound is built again with the harness's structured fallback measured in tokens
    (:func:`agents.prompts.build_prompt`: the history dropped oldest first, then the admissible list
    shortened, then the observation and the task cut in the middle), so the system header, the task, the
    current observation and the answer format stay while the history goes. Only a prompt that still does not
    fit loses tokens from its middle (its first quarter and its end are kept).

    Args:
        tokenizer: A tokenizer with a chat template.
        max_prompt_tokens: Longest prompt, in tokens.
    """

    def __init__(self, tokenizer, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` followed by the assistant generation prompt (no bound)."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count(self, text: str) -> int:
        """Tokens of ``text`` (the fallback's measure)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, build: Callable[..., list[dict[str, str]]]) -> list[int]:
        """Token ids of the prompt ``build()`` makes, within the bound.

        Args:
            build: Makes the prompt's messages; ``build(max_prompt_chars=n, measure=f)`` makes the same prompt
                with at most ``n`` units of ``f`` in its contents (:func:`agents.prompts.build_prompt`'s
                keywords).
        """
        messages = build()
        ids = self.encode(messages)
        if len(ids) <= self.max_prompt_tokens:
            return ids
        template_tokens = len(ids) - sum(self.count(m["content"]) for m in messages)
        budget = max(self.max_prompt_tokens - template_tokens, 1)
        ids = self.encode(build(max_prompt_chars=budget, measure=self.count))
        if len(ids) <= self.max_prompt_tokens:
            return ids
        head = self.max_prompt_tokens // 4
        return ids[:head] + ids[len(ids) - (self.max_prompt_tokens - head) :]


@dataclasses.dataclass
class PolicyAction(AgentAction):
    """A decision of the training policy, with the token-level data its step row keeps.

    Attributes:
        prompt_ids: The prompt's token ids.
        response_ids: The response's token ids (ending with the end-of-turn token when it stopped).
        logprobs: Per-token log-probs recorded at sampling (empty for scripted responses).
        choices: With constrained decoding, the candidate responses the response was drawn from.
        policy_version: The version of the weights that sampled it.
    """

    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    response_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    choices: list[list[int]] = dataclasses.field(default_factory=list)
    policy_version: int = 0


class PolicyAgent:
    """The training policy as an :class:`agents.base.Agent`: the worker's prompts, sampled by an engine (or
    written by a script), projected by the harness.

    The prompts of all playing copies are sampled in one ``engine.generate`` call per step, in copy order;
    copy ``i``'s response at step ``t`` is drawn from :func:`training.seeds.request_seed` of
    ``(sampling_seed, traj_offset + i, t)``, the seed the per-episode rollout gives the same response
    (:class:`EpisodePolicyAgent`).

    Args:
        worker: The prompt settings (:class:`RolloutWorker`).
        engine: Samples the responses.
        temperature: Sampling temperature.
        max_new_tokens: Response length limit.
        sampling_seed: The rollout's sampling seed.
        traj_offset: Trajectory id of copy 0.
        policy_version: The version of the engine's weights (recorded in each decision).
        scripted: Instead of ``engine``: ``info -> response text`` (e.g. the expert formatted as an answer);
            its decisions carry empty log-probs.
    """

    def __init__(
        self,
        worker: RolloutWorker,
        *,
        engine: GenerationEngine | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 32,
        sampling_seed: int = 0,
        traj_offset: int = 0,
        policy_version: int = 0,
        scripted: Callable[[dict[str, Any]], str] | None = None,
    ):
        if (engine is None) == (scripted is None):
            raise ValueError("a PolicyAgent needs exactly one of engine and scripted")
        self.worker = worker
        self.engine, self.scripted = engine, scripted
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.sampling_seed, self.traj_offset, self.policy_version = sampling_seed, traj_offset, policy_version
        self.histories: list[History] = []
        #: Seconds spent producing responses (sampling, or scripting and tokenising).
        self.sample_seconds = 0.0

    def reset(self, tasks: Sequence[Task]) -> None:
        """New episodes: one history per copy."""
        self.histories = [History(task_text=t.task_text) for t in tasks]

    def act(
        self,
        observations: Sequence[str],
        infos: Sequence[dict[str, Any]],
        active: Sequence[bool] | None = None,
    ) -> list[PolicyAction | None]:
        """One :class:`PolicyAction` per active copy (``None`` for the others)."""
        worker = self.worker
        index = [i for i, on in enumerate(active_mask(active, len(observations))) if on]
        asked = [worker.ask(self.histories[i], observations[i], infos[i]) for i in index]
        started = time.perf_counter()
        if self.scripted is not None:
            texts = [self.scripted(infos[i]) for i in index]
            responses = [response_token_ids(worker.tokenizer, t) for t in texts]
            for question, response in zip(asked, responses, strict=True):
                if worker.constrained_actions and response not in question.choices:
                    question.choices.append(response)  # a demonstration outside the list stays learnable
            logprobs = [[] for _ in index]
        else:
            sampled = self.engine.generate(
                [q.prompt_ids for q in asked],
                temperature=self.temperature,
                max_new_tokens=self.max_new_tokens,
                seeds=[
                    request_seed(self.sampling_seed, self.traj_offset + i, self.histories[i].num_steps)
                    for i in index
                ],
                candidates=[q.choices for q in asked] if worker.constrained_actions else None,
            )
            responses, logprobs = sampled.token_ids, sampled.logprobs
            texts = worker.tokenizer.batch_decode(responses, skip_special_tokens=True)
        self.sample_seconds += time.perf_counter() - started
        out: list[PolicyAction | None] = [None] * len(observations)
        for k, i in enumerate(index):
            out[i] = worker.answer(
                self.histories[i],
                observations[i],
                asked[k],
                texts[k],
                responses[k],
                logprobs[k],
                self.policy_version,
            )
        return out

    def close(self) -> None:
        """Nothing to release (the engine belongs to the caller)."""


@dataclasses.dataclass
class Question:
    """What the policy is asked at one step of one copy: the prompt and, constrained, the candidates."""

    prompt_ids: list[int]
    admissible: list[str]
    choices: list[list[int]]


class RolloutWorker:
    """Plays groups of episodes in a group vector env with the policy (:class:`PolicyAgent`) through the
    harness's loop (:func:`agents.rollout.play_episodes`), and turns the steps into :class:`StepRows`.

    Its prompts are in the style the env names in its metadata (``metadata["prompt_style"]``, for a remote
    env the hosted env's; :func:`agents.envs.prompt_style`).

    Args:
        envs: A :class:`progpo_envs.core.vector.GroupVectorEnv` (``num_envs = B·G``).
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
        tokenizer,
        history_length: int,
        max_prompt_tokens: int,
        template: str = "default",
        constrained_actions: bool = False,
    ):
        self.envs = envs
        self.env_kind = prompt_style(envs)  # the prompt style the env names in its metadata
        self.tokenizer = tokenizer
        self.history_length = history_length
        self.encode = PromptEncoder(tokenizer, max_prompt_tokens)
        self.template = template
        self.constrained_actions = constrained_actions
        self._answer_ids: dict[str, list[int]] = {}

    @classmethod
    def from_config(cls, envs, config: TrainConfig, tokenizer) -> RolloutWorker:
        """The worker a training run uses: prompts and decoding from ``config.rollout``, the prompt style the
        env names (:func:`agents.envs.prompt_style`)."""
        return cls(
            envs,
            tokenizer,
            config.rollout.history_length,
            config.rollout.max_prompt_tokens,
            template=config.rollout.template,
            constrained_actions=config.rollout.constrained_actions,
        )

    @classmethod
    def for_training(cls, config: TrainConfig, tokenizer, dist: DistContext) -> RolloutWorker:
        """The worker that plays this rank's share of the ``rollout.num_groups`` training groups: envs of the
        training split for its groups (at least one), ``rollout.group_size`` copies each."""
        groups = max(len(dist.shard(list(range(config.rollout.num_groups)))), 1)
        envs = make_split_envs(config.env, config.env.train_split, groups, config.rollout.group_size)
        return cls.from_config(envs, config, tokenizer)

    def answer_ids(self, action: str) -> list[int]:
        """Token ids of ``action`` in the answer format, ending with the end-of-turn token (cached)."""
        ids = self._answer_ids.get(action)
        if ids is None:
            ids = self._answer_ids[action] = response_token_ids(self.tokenizer, demonstration_text(action))
        return ids

    def ask(self, history: History, observation: str, info: dict[str, Any]) -> Question:
        """The prompt of one copy's step (the harness's :func:`agents.prompts.build_prompt` within the token
        bound) and, with constrained decoding, its candidate responses."""
        admissible = admissible_actions_from_info(self.env_kind, info)
        prompt = self.encode(
            functools.partial(
                build_prompt,
                self.env_kind,
                history.task_text,
                history,
                observation,
                admissible,
                history_length=self.history_length,
                template=self.template,
            )
        )
        choices = (
            [
                self.answer_ids(a)
                for a in get_style(self.env_kind).enumerable_commands(admissible, history.task_text)
            ]
            if self.constrained_actions
            else []
        )
        return Question(prompt, admissible, choices)

    def answer(
        self,
        history: History,
        observation: str,
        question: Question,
        text: str,
        response_ids: Sequence[int],
        logprobs: Sequence[float],
        policy_version: int,
    ) -> PolicyAction:
        """The decision of a response to ``question`` (the harness's projection); recorded in ``history``."""
        projection = project_action_with_reason(text, question.admissible)
        history.record(observation, projection.action)
        return PolicyAction(
            action=projection.action,
            valid=projection.valid,
            admissible=bool(projection.admissible),
            reason=projection.reason.value,
            raw_output=text,
            prompt_tokens=len(question.prompt_ids),
            completion_tokens=len(response_ids),
            prompt_ids=question.prompt_ids,
            response_ids=list(response_ids),
            logprobs=list(logprobs),
            choices=question.choices,
            policy_version=policy_version,
        )

    def run(
        self,
        *,
        seed: int | Sequence[int],
        task_indices: Sequence[int] | None = None,
        engine: GenerationEngine | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 32,
        sampling_seed: int = 0,
        policy_version: int = 0,
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
            sampling_seed: Seed of the responses (each drawn from :func:`training.seeds.request_seed`).
            policy_version: The version of the engine's weights (recorded in each row).
            scripted: Instead of ``engine``: ``info -> response text`` (e.g. the expert formatted as an
                answer); its rows carry empty log-probs.
            group_offset: Added to group ids (distinct ids across ranks and rounds).
            traj_offset: Added to trajectory ids.
        """
        agent = PolicyAgent(
            self,
            engine=engine,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            sampling_seed=sampling_seed,
            traj_offset=traj_offset,
            policy_version=policy_version,
            scripted=scripted,
        )
        group_size = self.envs.group_size
        recorder = RolloutRecorder()
        for vector_step in play_episodes(
            self.envs, agent, self.env_kind, seed=seed, task_indices=task_indices
        ):
            recorder.result.env_seconds += vector_step.env_seconds
            for t in vector_step.transitions:
                recorder.add(t, group_offset + t.slot // group_size, traj_offset + t.slot)
        recorder.result.sample_seconds = agent.sample_seconds
        recorder.result.episodes.sort(key=lambda e: e.traj_id)
        return recorder.result


class RolloutRecorder:
    """Turns played steps (:class:`agents.rollout.Transition`, with a :class:`PolicyAction` each) into
    :class:`StepRows` and, as episodes end, :class:`Episode` records: the one bookkeeping of the lock-step
    and the per-episode rollouts."""

    def __init__(self):
        self.result = RolloutResult(StepRows.empty(), [])
        self._invalid: dict[int, int] = defaultdict(int)
        self._score: dict[int, float] = defaultdict(float)

    def add(self, t: Transition, group_id: int, traj_id: int) -> None:
        """Record step ``t`` of trajectory ``traj_id`` of group ``group_id``."""
        rows, result = self.result.rows, self.result
        decision, info, next_info = t.decision, t.info, t.next_info
        rows.prompt_ids.append(decision.prompt_ids)
        rows.response_ids.append(decision.response_ids)
        rows.old_logprobs.append(decision.logprobs)
        rows.group_id.append(group_id)
        rows.traj_id.append(traj_id)
        rows.step.append(t.step)
        rows.reward.append(t.reward)
        rows.won.append(bool(next_info.get("won", False)))
        rows.valid.append(bool(decision.valid))
        rows.admissible.append(bool(decision.admissible))
        rows.obs_key.append(int(info["obs_hash"]))
        rows.action_key.append(int(text_digest(decision.action)))
        rows.admissible_key.append(int(action_set_key(info.get("admissible_actions") or ())))
        rows.history_key.append(int(info.get("history_key", 0)))
        rows.obs_text.append(t.observation)
        rows.action_text.append(decision.action)
        rows.choices.append(decision.choices)
        rows.policy_version.append(int(decision.policy_version))
        result.prompt_tokens += len(decision.prompt_ids)
        result.generated_tokens += len(decision.response_ids)
        result.env_steps += 1
        self._invalid[traj_id] += not decision.valid
        self._score[traj_id] += t.reward
        if t.done:
            result.episodes.append(
                Episode(
                    group_id=group_id,
                    traj_id=traj_id,
                    task_id=str(info.get("task_id", "")),
                    task_type=str(info.get("task_type", "")),
                    won=bool(next_info.get("won", False)),
                    score=float(self._score[traj_id]),
                    steps=t.step + 1,
                    invalid_steps=int(self._invalid[traj_id]),
                    task_score=(float(next_info["task_score"]) if "task_score" in next_info else None),
                    env_error=next_info.get("env_error"),
                )
            )


def mixed_outcome_groups(result: RolloutResult) -> tuple[list[int], set[int]]:
    """DAPO dynamic sampling: the groups whose episodes do not all have the same score, and their rows; a
    group an env failure cut short (:meth:`RolloutResult.env_failed_groups`) is never kept.

    Returns ``(row indices, group ids)`` of the groups kept.
    """
    scores: dict[int, set[float]] = defaultdict(set)
    for e in result.episodes:
        scores[e.group_id].add(round(e.score, 6))
    keep = {g for g, s in scores.items() if len(s) > 1} - result.env_failed_groups()
    return [i for i, g in enumerate(result.rows.group_id) if g in keep], keep


@dataclasses.dataclass(frozen=True)
class PlannedGroup:
    """One task group of an iteration's rollout round, as both rollout modes play it.

    Attributes:
        iteration: The iteration whose batch it belongs to (0-based).
        round: The dynamic-sampling round (0 without dynamic sampling).
        group_id: Its id in the iteration's rows: ``round · num_groups + g`` for global group ``g``.
        task_index: The training task it plays.
        reset_seed: The reset seed its copies share.
        sampling_seed: The round's sampling seed (copy ``c``'s step-``t`` response is drawn from
            ``request_seed(sampling_seed, group_id · G + c, t)``).
    """

    iteration: int
    round: int
    group_id: int
    task_index: int
    reset_seed: int
    sampling_seed: int


def plan_round(config: TrainConfig, iteration: int, round_index: int, split_size: int, dist: DistContext):
    """This rank's groups of round ``round_index`` of iteration ``iteration`` (:class:`PlannedGroup`).

    The round's ``rollout.num_groups`` tasks are a seeded function of ``(seed, iteration, round)`` drawn from
    the training split (or its ``rollout.task_pool``), the same on every rank; each rank plays its contiguous
    share of them (groups never span ranks). Group ``g`` of round ``r`` is numbered ``r·num_groups + g`` and
    reset with its own seed, and each response has its own seed (:func:`training.seeds.request_seed`), so a
    group plays the same on any number of ranks and in either rollout mode.
    """
    cfg = config.rollout
    pool = spread_tasks(split_size, cfg.task_pool) if cfg.task_pool else list(range(split_size))
    rng = np.random.default_rng(derive_seed(config.seed, "tasks", iteration, round_index))
    all_tasks = rng.choice(pool, size=cfg.num_groups, replace=cfg.num_groups > len(pool)).tolist()
    first_group = (cfg.num_groups * dist.rank) // dist.world_size
    reset_seed = derive_seed(config.seed, "reset", iteration, round_index) % (2**31 - cfg.num_groups)
    sampling_seed = derive_seed(config.seed, "sample", iteration, round_index)
    return [
        PlannedGroup(
            iteration=iteration,
            round=round_index,
            group_id=round_index * cfg.num_groups + first_group + b,
            task_index=int(task),
            reset_seed=reset_seed + first_group + b,
            sampling_seed=sampling_seed,
        )
        for b, task in enumerate(dist.shard(all_tasks))
    ]


def gather_rounds(
    config: TrainConfig, dist: DistContext, play_round: Callable[[int], RolloutResult]
) -> RolloutResult:
    """An iteration's batch from its rollout rounds (``play_round(r)`` plays round ``r`` on this rank), in
    either rollout mode.

    Without dynamic sampling, round 0. With DAPO's dynamic sampling (``rollout.dynamic_sampling``) groups
    whose episodes all scored the same, or that an env failure cut short, are dropped (``groups_dropped``)
    and more rounds are rolled until ``num_groups`` groups are kept over every rank or
    ``max_sampling_rounds`` ran out; when none was kept, the last round is used (zero advantages; its
    env-failed groups still left out by :func:`training.update.rows_to_train`).
    """
    cfg = config.rollout
    total = RolloutResult(StepRows.empty(), [])
    kept_groups = 0
    for round_index in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
        result = play_round(round_index)
        if not cfg.dynamic_sampling:
            return result
        keep = mixed_outcome_groups(result)[1]
        total.add(result, keep)
        total.groups_dropped += len({e.group_id for e in result.episodes}) - len(keep)
        kept_groups += len(keep)
        if dist.all_reduce_sum(kept_groups) >= cfg.num_groups:
            break
    if total.rows.num_rows == 0:  # dynamic sampling kept nothing: train on the last round
        total.rows.extend(result.rows)
        total.episodes.extend(e for e in result.episodes if e.env_error is None)  # the others are in already
        total.groups_dropped -= len({e.group_id for e in result.episodes})
    return total


def collect_groups(
    worker: RolloutWorker,
    engine: GenerationEngine,
    config: TrainConfig,
    iteration: int,
    dist: DistContext,
) -> RolloutResult:
    """Roll out iteration ``iteration``'s task groups on this rank in lock step (``rollout.mode=lockstep``):
    each round's groups are :func:`plan_round`'s, played together by :meth:`RolloutWorker.run`, the rounds
    gathered by :func:`gather_rounds`."""
    cfg = config.rollout
    split_size = num_tasks(worker.envs)

    def play_round(round_index: int) -> RolloutResult:
        groups = plan_round(config, iteration, round_index, split_size, dist)
        first = groups[0].group_id
        return worker.run(
            seed=[g.reset_seed for g in groups],
            task_indices=[g.task_index for g in groups],
            engine=engine,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            sampling_seed=groups[0].sampling_seed,
            policy_version=iteration,
            group_offset=first,
            traj_offset=first * cfg.group_size,
        )

    return gather_rounds(config, dist, play_round)
