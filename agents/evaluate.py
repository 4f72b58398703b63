"""Evaluation runner: play tasks ``0..N-1`` of a split with an agent, vectorised, resumable, reproducible.

Episodes run in batches on a :class:`~progpo_envs.core.vector.GroupVectorEnv` of ``num_envs`` copies
(``group_size=1``, ``vector_mode`` sync or async). A batch is a run of *consecutive* task indices, reset with
``seed = base_seed + first task index`` so that task ``t`` is always played with episode seed ``base_seed +
t``, whatever the batch size and however often the run was resumed. A batch shorter than ``num_envs`` (the
tail of the split, or a gap left by a resumed run) fills the spare copies with the last task and ignores them.

Every finished episode is appended at once as one JSON line to ``DIR/trajectories.jsonl`` (prompts, raw
outputs, parsed actions, observations, rewards, ``obs_hash``/``history_key`` as 16-digit hex). Rerunning with
the same ``--out`` skips the task indices already there (a line cut short by a kill is dropped), so an
interrupted run resumes without redoing finished episodes. ``DIR/run.json`` records the settings; resuming
with different ones is refused. At the end ``summary.json``, ``report.md`` and ``success.png`` are written
from all the lines (:mod:`agents.report`).

Example:
    >>> config = EvalConfig(env_id="progpo/ALFWorld-v0", agent="expert", out_dir="runs/expert",
    ...                     split="valid_seen", episodes=20)  # doctest: +SKIP
    >>> summary = evaluate(config)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from tqdm.auto import tqdm

from agents.base import Agent, AgentAction, PromptConfig, Task
from agents.prompts import EnvKind, env_kind_from_id, task_text_from_observation
from agents.report import write_reports
from agents.vector_info import unbatch_copy_infos, unbatch_info
from progpo_envs.core.vector import GroupVectorEnv

TRAJECTORIES_FILE = "trajectories.jsonl"
RUN_FILE = "run.json"
#: The env that plays an env hosted by an env server (``progpo_envs.server.remote``).
REMOTE_ENV_ID = "progpo/Remote-v0"
#: Settings that must match for a run to be resumed (others, like ``num_envs``, may change).
RESUME_KEYS = (
    "env_id",
    "agent",
    "split",
    "seed",
    "history_length",
    "template",
    "model",
    "env_kind",
    "max_steps",
)


class AgentKind(str, enum.Enum):
    """The agents ``progpo eval --agent`` can build."""

    EXPERT = "expert"
    RANDOM = "random"
    OPENAI = "openai"
    TRANSFORMERS = "transformers"
    HUMAN = "human"


@dataclasses.dataclass
class EvalConfig:
    """One evaluation run.

    Attributes:
        env_id: Registered env id (``progpo/ALFWorld-v0``, ``progpo/WebShop-v0``, ...).
        agent: Which agent (:class:`AgentKind` value).
        out_dir: Where trajectories, summary and report go (also the resume state).
        split: Split passed to the env as ``split=`` (``None``: the env's default).
        episodes: Play tasks ``0..episodes-1`` (``None``: every task of the split).
        data_dir: Passed to the env as ``data_dir=``.
        env_url: A remote env server, passed to the env as ``url=``.
        env_kind: ``alfworld``/``webshop`` prompt style (``None``: from the env id).
        seed: Base seed: task ``t`` is reset with ``seed + t``; agents sample from seeds derived from it.
        num_envs: Env copies stepped together.
        vector_mode: ``sync`` (in-process) or ``async`` (subprocesses).
        max_steps: Passed to the env as ``max_steps=`` (``None``: the env's default).
        history_length: Steps of history in LLM prompts.
        template: ``default``, ``react`` or ``compact`` (:class:`agents.prompts.PromptTemplate`).
        max_prompt_chars: Prompt length bound (characters).
        model: Model name (openai) or path (transformers).
        base_url: OpenAI-compatible endpoint.
        api_key_env: Environment variable with the API key.
        concurrency: Requests in flight (openai).
        timeout_s: Per-request timeout (openai).
        temperature: Sampling temperature (0: greedy).
        max_tokens: Completion tokens per step.
        device: torch device (transformers).
        batch_size: Rows per forward pass (transformers).
        env_kwargs: Further env keyword arguments.
    """

    env_id: str
    agent: str
    out_dir: str
    split: str | None = None
    episodes: int | None = None
    data_dir: str | None = None
    env_url: str | None = None
    env_kind: str | None = None
    seed: int = 0
    num_envs: int = 1
    vector_mode: str = "sync"
    max_steps: int | None = None
    history_length: int = 2
    template: str = "default"
    max_prompt_chars: int | None = 13_000
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout_s: float = 60.0
    temperature: float = 0.0
    max_tokens: int = 512
    device: str | None = None
    batch_size: int = 8
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def kind(self) -> EnvKind:
        """The prompt style: ``env_kind``, else from the env id (for the remote env: the hosted env's id)."""
        if self.env_kind:
            return EnvKind(self.env_kind)
        hosted = self.env_kwargs.get("env_id")
        return env_kind_from_id(hosted if self.env_id == REMOTE_ENV_ID and hosted else self.env_id)

    def env_arguments(self) -> dict[str, Any]:
        """Keyword arguments for every env copy (``url`` not included: see :meth:`vector_env_spec`)."""
        kwargs = dict(self.env_kwargs)
        for name, value in (
            ("split", self.split),
            ("data_dir", self.data_dir),
            ("max_steps", self.max_steps),
        ):
            if value is not None:
                kwargs[name] = value
        if AgentKind(self.agent) is AgentKind.EXPERT:
            kwargs["expert"] = True
        return kwargs

    def vector_env_spec(self) -> tuple[str, dict[str, Any]]:
        """``(env id, kwargs)`` to make: with ``env_url``, the env itself when it takes ``url=`` (e.g. WebShop
        against its own shop server), otherwise ``progpo/Remote-v0`` hosting ``env_id`` on an env server."""
        kwargs = self.env_arguments()
        if self.env_url is None:
            return self.env_id, kwargs
        if self.env_id == REMOTE_ENV_ID or _accepts_url(self.env_id):
            return self.env_id, {**kwargs, "url": self.env_url}
        if REMOTE_ENV_ID not in gym.registry:
            raise ValueError(
                f"{self.env_id} takes no url= and {REMOTE_ENV_ID} is not registered to reach it remotely"
            )
        return REMOTE_ENV_ID, {**kwargs, "url": self.env_url, "env_id": self.env_id}


def _accepts_url(env_id: str) -> bool:
    """Whether the registered env's constructor has a ``url`` parameter."""
    import inspect

    entry_point = gym.spec(env_id).entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    return "url" in inspect.signature(creator).parameters


def build_agent(config: EvalConfig) -> Agent:
    """The agent ``config.agent`` names, configured from ``config``."""
    kind = AgentKind(config.agent)
    prompt_config = PromptConfig(
        history_length=config.history_length,
        template=config.template,
        max_prompt_chars=config.max_prompt_chars,
    )
    if kind is AgentKind.EXPERT:
        from agents.scripted import ExpertAgent

        return ExpertAgent()
    if kind is AgentKind.RANDOM:
        from agents.scripted import RandomAgent

        return RandomAgent(seed=config.seed)
    if kind is AgentKind.HUMAN:
        from agents.scripted import HumanAgent

        return HumanAgent()
    if not config.model:
        raise ValueError(f"--agent {kind.value} needs --model")
    if kind is AgentKind.OPENAI:
        from agents.openai_agent import OpenAIChatAgent, OpenAIConfig

        return OpenAIChatAgent(
            OpenAIConfig(
                model=config.model,
                base_url=config.base_url,
                api_key_env=config.api_key_env,
                concurrency=config.concurrency,
                timeout_s=config.timeout_s,
                temperature=config.temperature,
                max_tokens=config.max_tokens,
            ),
            prompt_config,
        )
    from agents.transformers_agent import TransformersAgent, TransformersConfig

    return TransformersAgent(
        TransformersConfig(
            model_path=config.model,
            device=config.device,
            batch_size=config.batch_size,
            temperature=config.temperature,
            max_new_tokens=config.max_tokens,
        ),
        prompt_config,
    )


def _hex(key: Any) -> str | None:
    return None if key is None else f"{int(key):016x}"


def _json_default(value: Any) -> Any:
    """JSON for the numpy values an env's ``info`` may carry (64-bit keys become 16-digit hex)."""
    if isinstance(value, np.uint64):
        return _hex(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def consecutive_batches(task_indices: Sequence[int], size: int) -> Iterator[list[int]]:
    """Split sorted task indices into runs of consecutive indices of at most ``size``."""
    batch: list[int] = []
    for t in task_indices:
        if batch and (len(batch) == size or t != batch[-1] + 1):
            yield batch
            batch = []
        batch.append(t)
    if batch:
        yield batch


def load_finished(path: Path) -> dict[int, dict[str, Any]]:
    """Episodes in ``trajectories.jsonl`` by task index; a last line cut short by a kill is removed."""
    finished: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return finished
    good_bytes = 0
    with path.open("rb") as f:
        for raw in f:
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            finished[int(record["task_index"])] = record
            good_bytes += len(raw)
    if good_bytes != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return finished


class _Episode:
    """Collects one slot's episode into its JSON record."""

    def __init__(self, task: Task, observation: str, info: dict[str, Any]):
        self.task = task
        self.steps: list[dict[str, Any]] = []
        self.observation, self.info = observation, info
        self.total_reward = 0.0

    def add(
        self,
        decision: AgentAction,
        reward: float,
        terminated: bool,
        truncated: bool,
        next_observation: str,
        next_info: dict[str, Any],
    ) -> None:
        self.steps.append(
            {
                "step": len(self.steps),
                "observation": self.observation,
                "obs_hash": _hex(self.info.get("obs_hash")),
                "history_key": _hex(self.info.get("history_key")),
                "prompt": decision.prompt,
                "raw_output": decision.raw_output,
                "action": decision.action,
                "valid": decision.valid,
                "admissible": decision.admissible,
                "invalid_reason": decision.reason,
                "prompt_tokens": decision.prompt_tokens,
                "completion_tokens": decision.completion_tokens,
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            }
        )
        self.total_reward += float(reward)
        self.observation, self.info = next_observation, next_info

    def record(self) -> dict[str, Any]:
        info, steps = self.info, self.steps
        won = bool(info.get("won", False))
        score = info.get("task_score")
        return {
            "task_index": self.task.task_index,
            "task_id": self.task.task_id,
            "task_type": self.task.task_type,
            "task_text": self.task.task_text,
            "seed": self.task.seed,
            "won": won,
            "score": float(score) if score is not None else float(won),
            "return": self.total_reward,
            "steps": len(steps),
            "terminated": bool(steps and steps[-1]["terminated"]),
            "truncated": bool(steps and steps[-1]["truncated"]),
            "invalid_actions": sum(not s["valid"] for s in steps),
            "inadmissible_actions": sum(s["admissible"] is False for s in steps),
            "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
            "completion_tokens": sum(s["completion_tokens"] for s in steps),
            "final_observation": self.observation,
            "final_obs_hash": _hex(info.get("obs_hash")),
            "final_history_key": _hex(info.get("history_key")),
            "trajectory": steps,
        }


def _resume_settings(config: EvalConfig) -> dict[str, Any]:
    settings = {k: getattr(config, k) for k in RESUME_KEYS}
    settings["env_kind"] = config.kind().value
    return settings


def _check_resume(out_dir: Path, config: EvalConfig) -> None:
    """Refuse to continue a run in ``out_dir`` that was started with other settings."""
    run_file = out_dir / RUN_FILE
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        changed = {
            k: (previous.get(k), v) for k, v in _resume_settings(config).items() if previous.get(k) != v
        }
        if changed:
            raise ValueError(
                f"{out_dir} holds a run with other settings {changed} (old, new); "
                "use another --out to start afresh"
            )


def _record_settings(out_dir: Path, config: EvalConfig) -> None:
    run_file = out_dir / RUN_FILE
    if not run_file.exists():
        settings = {**_resume_settings(config), "config": dataclasses.asdict(config)}
        run_file.write_text(json.dumps(settings, indent=2, default=str) + "\n")


def evaluate(
    config: EvalConfig,
    agent: Agent | None = None,
    *,
    envs: gym.vector.VectorEnv | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) an evaluation and write its files; returns the summary.

    Nothing is written before the settings are checked (a bad ``--episodes`` or a missing ``--model`` leaves
    ``out_dir`` untouched).

    Args:
        config: What to run.
        agent: An agent to use instead of the one ``config.agent`` names (the harness still records
            ``config.agent`` as its name); the caller closes it.
        envs: A vector env of ``config.num_envs`` copies built by the caller (``group_size=1``; the caller
            closes it), instead of ``gym.make_vec(config.env_id, ...)``.
        progress: Show a progress bar.
    """
    if config.num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {config.num_envs}")
    kind = config.kind()
    out_dir = Path(config.out_dir)
    _check_resume(out_dir, config)
    own_agent = agent is None
    agent = agent or build_agent(config)

    import progpo_envs  # noqa: F401  (registers the env ids)

    own_envs = envs is None
    try:
        if envs is None:
            env_id, env_arguments = config.vector_env_spec()
            try:
                envs = gym.make_vec(
                    env_id,
                    num_envs=config.num_envs,
                    group_size=1,
                    vector_mode=config.vector_mode,
                    **env_arguments,
                )
            except TypeError as error:  # an argument the env does not take
                raise ValueError(
                    f"{env_id} cannot be made with the arguments {sorted(env_arguments)}: {error}"
                ) from error
        elif envs.num_envs != config.num_envs:
            raise ValueError(f"envs has {envs.num_envs} copies but config.num_envs is {config.num_envs}")
        num_tasks = int(envs.get_attr("num_tasks")[0])
        episodes = num_tasks if config.episodes is None else int(config.episodes)
        if not 0 < episodes <= num_tasks:
            raise ValueError(f"--episodes must be in 1..{num_tasks} (tasks in the split), got {episodes}")
        out_dir.mkdir(parents=True, exist_ok=True)
        _record_settings(out_dir, config)
        trajectories = out_dir / TRAJECTORIES_FILE
        finished = load_finished(trajectories)
        remaining = [t for t in range(episodes) if t not in finished]
        bar = tqdm(
            total=episodes,
            initial=episodes - len(remaining),
            desc=f"eval {config.env_id}",
            unit="ep",
            disable=not progress,
        )
        with trajectories.open("a", encoding="utf-8") as sink:
            for batch in consecutive_batches(remaining, config.num_envs):
                for record in _play_batch(envs, agent, kind, batch, config):
                    sink.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
                    sink.flush()
                    finished[record["task_index"]] = record
                    bar.update(1)
        bar.close()
    finally:
        if own_envs and envs is not None:
            envs.close()
        if own_agent:
            agent.close()
    records = [finished[t] for t in sorted(finished) if t < episodes]
    return write_reports(out_dir, records, config)


def _reset(
    envs: gym.vector.VectorEnv, *, seed: int, options: dict[str, Any]
) -> tuple[Sequence[str], list[dict[str, Any]]]:
    """``envs.reset`` with one info per copy (a :class:`GroupVectorEnv` skips batching its copies' infos)."""
    if isinstance(envs, GroupVectorEnv):
        observations, copy_infos = envs.reset_copies(seed=seed, options=options)
        return observations, unbatch_copy_infos(copy_infos, envs.batch_infos)
    observations, info = envs.reset(seed=seed, options=options)
    return observations, unbatch_info(info, envs.num_envs)


def _step(envs: gym.vector.VectorEnv, actions: list[str]) -> tuple[Any, Any, Any, Any, list[dict[str, Any]]]:
    """``envs.step`` with one info per copy (a :class:`GroupVectorEnv` skips batching its copies' infos)."""
    if isinstance(envs, GroupVectorEnv):
        *results, copy_infos = envs.step_copies(actions)
        return (*results, unbatch_copy_infos(copy_infos, envs.batch_infos))
    *results, info = envs.step(actions)
    return (*results, unbatch_info(info, envs.num_envs))


def _play_batch(
    envs: gym.vector.VectorEnv, agent: Agent, kind: EnvKind, batch: list[int], config: EvalConfig
) -> Iterator[dict[str, Any]]:
    """Play one batch of consecutive tasks; yields each episode's record as soon as it ends."""
    num_envs = envs.num_envs
    padded = batch + [batch[-1]] * (num_envs - len(batch))
    observations, infos = _reset(envs, seed=config.seed + batch[0], options={"task_indices": padded})
    tasks = [
        Task(
            env_kind=kind.value,
            task_index=t,
            task_id=str(infos[i].get("task_id", t)),
            task_text=task_text_from_observation(kind, observations[i], infos[i]),
            task_type=str(infos[i].get("task_type", "") or ""),
            seed=config.seed + batch[0] + i,
        )
        for i, t in enumerate(padded)
    ]
    agent.reset(tasks)
    episodes = [_Episode(tasks[i], observations[i], infos[i]) for i in range(num_envs)]
    active = [i < len(batch) for i in range(num_envs)]
    step_budget = 100_000  # a guard against an env that never ends an episode; TextEnv truncates at max_steps
    while any(active):
        decisions = agent.act(observations, infos, active)
        actions = [
            d.action if (on and d is not None) else "" for d, on in zip(decisions, active, strict=True)
        ]
        observations, reward_array, terminated_array, truncated_array, infos = _step(envs, actions)
        # plain Python values: indexing a list is several times cheaper than indexing an array per slot
        rewards = np.asarray(reward_array).tolist()
        terminations = np.asarray(terminated_array).tolist()
        truncations = np.asarray(truncated_array).tolist()
        for i in range(num_envs):
            if not active[i]:
                continue
            decision = decisions[i]
            if decision is None:
                raise RuntimeError(f"the agent returned no action for active env slot {i}")
            episodes[i].add(decision, rewards[i], terminations[i], truncations[i], observations[i], infos[i])
            if terminations[i] or truncations[i]:
                active[i] = False
                yield episodes[i].record()
        step_budget -= 1
        if step_budget <= 0:
            raise RuntimeError("episodes did not end after 100000 steps; does the env truncate at max_steps?")
