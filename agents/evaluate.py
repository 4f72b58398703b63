"""Evaluation runner: play ``N`` tasks of a split with an agent, vectorised, resumable, reproducible.

Which tasks: every task of the split, or the first ``N`` of :class:`TaskOrder`: ``stratified`` by default
(each task type in turn, so ``--episodes 6`` on ALFWorld plays one task of each of its six types; envs that do
not list their tasks' types, such as WebShop or a remote env, keep the split's order), ``sequential`` (tasks
``0..N-1``, the order before this option) or ``spread`` (``N`` tasks evenly over the split: the tasks of
``progpo train``'s held-out evaluation, so a served checkpoint is scored on the trainer's own tasks).

Episodes run in batches on a :class:`~progpo_envs.core.vector.GroupVectorEnv` of ``num_envs`` copies
(``group_size=1``, ``vector_mode`` sync or async). By default ``num_envs`` follows the agent
(:meth:`EvalConfig.copies`): an agent that talks to a server plays ``concurrency`` episodes at once, so every
step sends that many requests together and the server batches them (vLLM's continuous batching: one request at
a time leaves it nearly idle); the local transformers agent plays ``batch_size`` at once (one forward pass per
step); the scripted agents, which answer at once, play one.

A batch is up to ``num_envs`` of the tasks still to play, in order; copy ``i`` plays the batch's task ``t_i``
reset with seed ``base_seed + t_i``, so task ``t`` is always played with episode seed ``base_seed + t``,
whatever the batch size, the task order and however often the run was resumed. A batch shorter than
``num_envs`` (the tail of the run) fills the spare copies with its last task and ignores them. LLM agents
sample from seeds fixed by (task, episode seed, step), so the episodes do not depend on how many are played
at once either.

Every finished episode is appended at once as one JSON line to ``DIR/trajectories.jsonl`` (prompts, raw
outputs up to :data:`MAX_STORED_OUTPUT_CHARS` characters each, parsed actions, observations, rewards,
``obs_hash``/``history_key`` as 16-digit hex). Rerunning with the same ``--out`` skips the task indices
already there, so an interrupted run resumes without redoing finished episodes: a line cut short by a kill, or
damaged anywhere in the file, is set aside and only its task is played again (:func:`load_finished`). One run
at a time writes a ``DIR``: a second one, or a ``progpo train`` there, is refused while the first holds the
run folder's lock (:mod:`progpo_base.folder_lock`: an ``flock`` the kernel releases when the process ends,
however it ends). ``DIR/run.json`` records the settings; resuming with different ones is refused. At the end
``summary.json``, ``report.md`` and ``success.png`` are written from all the lines (:mod:`agents.report`).

An episode whose agent could not decide (an LLM request refused or still failing after its retries), or whose
env server was lost under it (``info["env_error"]``: several servers, :mod:`progpo_envs.server.fleet`), ends
there: it is recorded with its ``error`` (and the steps before it), counted in the summary's ``errors`` apart
from the failed episodes, and played again by the next run on the same ``--out``; the other episodes go on.
When more than :meth:`EvalConfig.allowed_errors` episodes end with an error, no further batch is started.
With several env servers, ``summary.json``'s ``servers`` is each one's state and share at the end
(:func:`agents.envs.server_status`).

Example:
    >>> config = EvalConfig(env_id="progpo/ALFWorld-v0", agent="expert", out_dir="runs/expert",
    ...                     split="valid_seen", episodes=20)  # doctest: +SKIP
    >>> summary = evaluate(config)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agents.base import Agent, AgentAction, AnswerMode, PromptConfig, Task
from agents.envs import (
    make_group_envs,
    num_tasks,
    prompt_style,
    server_status,
    split_name,
    spread_tasks,
    task_types,
)
from agents.llm_config import OpenAIConfig, TransformersConfig
from agents.prompts import get_style
from agents.report import write_reports
from agents.rollout import play_episodes
from progpo_base.config import documented_field, enum_field, required_field, section
from progpo_base.folder_lock import folder_lock
from progpo_envs.server.policy import refused_kwarg
from progpo_envs.server.remote import RemoteEnvError

TRAJECTORIES_FILE = "trajectories.jsonl"
#: Where lines of ``trajectories.jsonl`` that do not parse are moved (their tasks are played again).
DAMAGED_FILE = "trajectories.jsonl.damaged"
RUN_FILE = "run.json"
#: Characters of a model's output kept per step in the trajectory (the rest is cut; ``raw_output_chars``
#: records the full length): a misbehaving endpoint's 10 MB completion must not make a 100 MB file.
MAX_STORED_OUTPUT_CHARS = 32_768
#: Default of ``--max-errors``: the share of the episodes that may end with an agent error.
DEFAULT_MAX_ERRORS = 0.05
#: Settings that must match for a run to be resumed (others, like ``num_envs``, may change): their names in
#: ``run.json`` and where :class:`EvalConfig` holds them.
RESUME_KEYS = {
    "env_id": "env_id",
    "agent": "agent",
    "split": "split",
    "seed": "seed",
    "history_length": "prompt.history_length",
    "template": "prompt.template",
    "model": "model",
    "env_kind": "env_kind",
    "max_steps": "max_steps",
    "task_order": "task_order",
    "mode": "mode",
}
#: What a ``run.json`` written before a resume key existed meant by it.
RESUME_DEFAULTS = {"mode": AnswerMode.FREE.value}


class TaskOrder(str, enum.Enum):
    """The order of the tasks; a partial evaluation (``episodes`` < the split's size) plays its start."""

    STRATIFIED = "stratified"  # each task type in turn (:func:`stratified_order`), so a few cover every type
    SEQUENTIAL = "sequential"  # the split's own order (tasks 0..episodes-1)
    SPREAD = "spread"  # evenly over the split (agents.envs.spread_tasks): the trainer's held-out tasks


def stratified_order(types: Sequence[str]) -> list[int]:
    """Task indices that take each task type in turn (a type's tasks in the split's order).

    The first ``n`` indices cover ``min(n, number of types)`` types and keep the per-type counts within one of
    each other, so a partial run fills every row of the per-type table.

    Example:
        >>> stratified_order(["clean", "clean", "clean", "heat", "heat", "put"])
        [0, 3, 5, 1, 4, 2]
    """
    by_type: dict[str, list[int]] = {}
    for index, task_type in enumerate(types):
        by_type.setdefault(task_type, []).append(index)
    queues = list(by_type.values())
    longest = max((len(queue) for queue in queues), default=0)
    return [queue[rank] for rank in range(longest) for queue in queues if rank < len(queue)]


class AgentKind(str, enum.Enum):
    """The agents ``progpo eval --agent`` can build."""

    EXPERT = "expert"
    RANDOM = "random"
    OPENAI = "openai"
    TRANSFORMERS = "transformers"
    HUMAN = "human"


#: The agents that answer with a model: ``mode`` (free or guided) applies to them.
LLM_AGENTS = (AgentKind.OPENAI, AgentKind.TRANSFORMERS)


@dataclasses.dataclass
class EvalConfig:
    """One evaluation run: the run's settings, then the sections of the agents that use them (``prompt`` for
    the LLM agents, ``openai`` or ``transformers`` for the one ``agent`` names). ``progpo eval`` builds it
    from ``key=value`` and ``section.key=value`` overrides, a ``--config`` YAML file and short flags;
    ``progpo eval --help-config`` lists every key."""

    env_id: str = required_field("registered env id, e.g. progpo/ALFWorld-v0 or progpo/WebShop-v0")
    agent: str = required_field("the agent to evaluate", choices=[k.value for k in AgentKind])
    out_dir: str = required_field("output folder: trajectories, summary, report (rerun with it to resume)")
    mode: str = enum_field(
        AnswerMode.FREE,
        "how an LLM agent answers: free text in the papers' <think>/<action> format, or guided: its choice "
        "among the admissible actions (transformers: by log-probability; openai: vLLM's guided choice)",
    )
    split: str | None = documented_field(
        None,
        "env split: ALFWorld a folder of json_2.1.1 (train, valid_seen, valid_unseen, ...), WebShop test, "
        "train or all (unset: the env's, train for both)",
    )
    episodes: int | None = documented_field(
        None, "play this many tasks in task_order (unset: every task of the split)"
    )
    task_order: str = enum_field(
        TaskOrder.STRATIFIED,
        "which tasks episodes plays: stratified takes each task type in turn (in-process ALFWorld; other "
        "envs keep the split's order), sequential plays tasks 0..N-1, spread N tasks evenly over the split "
        "(the tasks of progpo train's held-out evaluation with eval.num_tasks=N)",
    )
    data_dir: str | None = documented_field(
        None, "env data folder, passed as data_dir= (ALFWorld: the folder containing json_2.1.1/)"
    )
    env_url: str | None = documented_field(
        None,
        "env server URL (progpo serve; docker compose: ALFWorld :8000, WebShop :8001): any env is played "
        "through progpo/Remote-v0 on it, as progpo train's env.url; several env servers separated by commas "
        "(groups spread over them, a lost one's moved to the others)",
    )
    shop_url: str | None = documented_field(
        None,
        "WebShop site URL (progpo webshop serve; docker compose: :3000): progpo/WebShop-v0 runs here and "
        "plays against the site's session API (the env's url=); not an env server (that is --env-url)",
    )
    env_kind: str | None = documented_field(
        None,
        "prompt style: alfworld, webshop, text or a registered one (unset: the one the env names in its "
        "metadata; a remote env's: the hosted env's)",
    )
    seed: int = documented_field(
        0, "base seed: task t is reset with seed + t; agents sample from seeds of it"
    )
    num_envs: int | None = documented_field(
        None,
        "episodes played at once (unset: openai.concurrency for openai, transformers.batch_size for "
        "transformers, 1 for the scripted agents; at most episodes); the episodes do not depend on it",
    )
    vector_mode: str = documented_field(
        "sync", "env copies in this process (sync) or in subprocesses (async)", choices=["sync", "async"]
    )
    max_steps: int | None = documented_field(
        None, "steps per episode, passed as max_steps= (unset: the env's)"
    )
    env_kwargs: dict[str, Any] = documented_field({}, "extra env keyword arguments")
    max_errors: float = documented_field(
        DEFAULT_MAX_ERRORS,
        "episodes that may end with an agent error (a request that failed for good) before the run "
        "fails (exit status 1): a share of the episodes below 1, a number from 1 up; errored episodes are "
        "recorded, not scored, and played again by a rerun",
    )
    prompt: PromptConfig = section(PromptConfig, "prompts of the LLM agents")
    openai: OpenAIConfig = section(OpenAIConfig, "the openai agent: endpoint and sampling")
    transformers: TransformersConfig = section(
        TransformersConfig, "the transformers agent: model and sampling"
    )

    @property
    def model(self) -> str | None:
        """The model the agent runs (``openai.model`` or ``transformers.model_path``; ``None`` for the
        scripted agents, or when unset)."""
        kind = AgentKind(self.agent)
        chosen = {AgentKind.OPENAI: self.openai.model, AgentKind.TRANSFORMERS: self.transformers.model_path}
        return chosen.get(kind) or None

    @property
    def answer_mode(self) -> str | None:
        """How the agent answers (``mode``) when it is an LLM agent; ``None`` for the scripted agents.

        Example:
            >>> EvalConfig(env_id="progpo/WebShop-v0", agent="random", out_dir="runs/x").answer_mode is None
            True
        """
        return self.mode if AgentKind(self.agent) in LLM_AGENTS else None

    def allowed_errors(self, episodes: int) -> int:
        """Episodes of ``episodes`` that may end with an agent error (more fail the run).

        Example:
            >>> config = EvalConfig(env_id="progpo/WebShop-v0", agent="openai", out_dir="runs/x")
            >>> config.allowed_errors(20), config.allowed_errors(100), config.allowed_errors(10)
            (1, 5, 0)
            >>> dataclasses.replace(config, max_errors=3).allowed_errors(10)
            3
        """
        if self.max_errors >= 1:
            return int(self.max_errors)
        return math.floor(self.max_errors * episodes + 1e-9)  # 0.29 * 100 is 28.999...

    def kind(self, envs: gym.vector.VectorEnv) -> str:
        """The prompt style ``envs`` are played in: ``env_kind``, else the one the env names in its metadata
        (:func:`agents.envs.prompt_style`); a :class:`ValueError` for a style that is not registered."""
        return get_style(self.env_kind).name if self.env_kind else prompt_style(envs)

    def copies(self) -> int:
        """Env copies to step together: ``num_envs`` when set, else what keeps the agent busy (``concurrency``
        for ``openai``, ``batch_size`` for ``transformers``, 1 for the scripted agents), at most ``episodes``.

        The episodes played do not depend on it (task ``t`` is always reset with ``seed + t``).

        Example:
            >>> EvalConfig(env_id="progpo/WebShop-v0", agent="openai", out_dir="runs/x").copies()
            32
            >>> EvalConfig(env_id="progpo/WebShop-v0", agent="openai", out_dir="runs/x", episodes=6).copies()
            6
            >>> EvalConfig(env_id="progpo/WebShop-v0", agent="expert", out_dir="runs/x").copies()
            1
        """
        if self.num_envs is not None:
            return self.num_envs
        kind = AgentKind(self.agent)
        wanted = {
            AgentKind.OPENAI: self.openai.concurrency,
            AgentKind.TRANSFORMERS: self.transformers.batch_size,
        }
        wanted = wanted.get(kind, 1)
        return max(1, min(wanted, self.episodes)) if self.episodes else max(1, wanted)

    def env_arguments(self) -> dict[str, Any]:
        """Keyword arguments for every env copy: the env's own ``url=`` is ``shop_url`` (``env_url``, the env
        server, is :func:`agents.envs.make_group_envs`'s ``server_url``)."""
        kwargs = dict(self.env_kwargs)
        for name, value in (
            ("split", self.split),
            ("data_dir", self.data_dir),
            ("max_steps", self.max_steps),
            ("url", self.shop_url),
        ):
            if value is not None:
                kwargs[name] = value
        if AgentKind(self.agent) is AgentKind.EXPERT:
            kwargs["expert"] = True
        return kwargs


def build_agent(config: EvalConfig) -> Agent:
    """The agent ``config.agent`` names, configured from its section of ``config``."""
    kind = AgentKind(config.agent)
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
        key = "openai.model" if kind is AgentKind.OPENAI else "transformers.model_path"
        raise ValueError(f"--agent {kind.value} needs --model ({key})")
    if kind is AgentKind.OPENAI:
        from agents.openai_agent import OpenAIChatAgent

        return OpenAIChatAgent(config.openai, config.prompt, config.mode)
    from agents.transformers_agent import TransformersAgent

    return TransformersAgent(config.transformers, config.prompt, config.mode)


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


def load_finished(path: Path) -> dict[int, dict[str, Any]]:
    """The finished episodes in ``trajectories.jsonl`` by task index, the file made fit to append to.

    Kept: every line that is a whole episode record, wherever it is. Set aside, so that only their tasks are
    played again: a line that does not parse or does not end the file properly (a write cut short by a kill, a
    damaged byte: its bytes are moved to :data:`DAMAGED_FILE`, and the lines after it are kept), and an
    episode recorded with an ``error`` (a failed agent request: retried). A task recorded twice keeps its
    first record. When anything is set aside the file is rewritten (a new file renamed over the old one).
    """
    finished: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return finished
    kept: list[bytes] = []
    damaged: list[bytes] = []
    lines = 0
    with path.open("rb") as f:
        for raw in f:
            lines += 1
            try:
                record = json.loads(raw) if raw.endswith(b"\n") else None
                task_index = int(record["task_index"]) if isinstance(record, dict) else None
            except (ValueError, KeyError, TypeError):  # JSONDecodeError, UnicodeDecodeError: ValueErrors
                task_index = None
            if task_index is None:
                damaged.append(raw)
            elif record.get("error") is None and task_index not in finished:
                finished[task_index] = record
                kept.append(raw)
    if len(kept) != lines:
        if damaged:
            with (path.parent / DAMAGED_FILE).open("ab") as sink:
                sink.writelines(line if line.endswith(b"\n") else line + b"\n" for line in damaged)
            print(
                f"progpo eval: {len(damaged)} damaged line(s) of {path} moved to {DAMAGED_FILE}; "
                "their tasks are played again",
                file=sys.stderr,
            )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as sink:
            sink.writelines(kept)
        os.replace(tmp, path)
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
                "raw_output": decision.raw_output[:MAX_STORED_OUTPUT_CHARS],
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
        if len(decision.raw_output) > MAX_STORED_OUTPUT_CHARS:
            self.steps[-1]["raw_output_chars"] = len(decision.raw_output)  # the length before the cut
        self.total_reward += float(reward)
        self.observation, self.info = next_observation, next_info

    def record(self, error: str | None = None) -> dict[str, Any]:
        """The episode's JSON record; with ``error`` (an agent failure, or its env server lost) it ends there
        and is not scored."""
        info, steps = self.info, self.steps
        won = bool(info.get("won", False)) and error is None
        score = info.get("task_score") if error is None else 0.0
        record = {
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
        if error is not None:
            record["error"] = error
        return record


def _resume_settings(config: EvalConfig, kind: str) -> dict[str, Any]:
    settings = {
        name: functools.reduce(getattr, where.split("."), config) for name, where in RESUME_KEYS.items()
    }
    settings["env_kind"] = kind
    return settings


def _check_resume(out_dir: Path, config: EvalConfig, kind: str) -> None:
    """Refuse to continue a run in ``out_dir`` that was started with other settings."""
    run_file = out_dir / RUN_FILE
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        previous = RESUME_DEFAULTS | previous
        changed = {
            k: (previous.get(k), v) for k, v in _resume_settings(config, kind).items() if previous.get(k) != v
        }
        if changed:
            raise ValueError(
                f"{out_dir} holds a run with other settings {changed} (old, new); "
                "use another --out to start afresh"
            )


def _record_settings(out_dir: Path, config: EvalConfig, kind: str) -> None:
    run_file = out_dir / RUN_FILE
    if not run_file.exists():
        settings = {**_resume_settings(config, kind), "config": dataclasses.asdict(config)}
        run_file.write_text(json.dumps(settings, indent=2, default=str) + "\n")


def task_selection(envs: gym.vector.VectorEnv, episodes: int, order: TaskOrder) -> list[int]:
    """The task indices a run of ``episodes`` plays, in ``order`` (see :class:`TaskOrder`)."""
    if order is TaskOrder.SPREAD:
        return spread_tasks(num_tasks(envs), episodes)
    types = task_types(envs) if order is TaskOrder.STRATIFIED else None
    return stratified_order(types)[:episodes] if types else list(range(episodes))


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
        envs: A vector env built by the caller (``group_size=1``; the caller closes it), instead of
            ``gym.make_vec(config.env_id, ...)``; its size must be ``config.num_envs`` when that is set.
        progress: Show a progress bar.
    """
    if config.num_envs is not None and config.num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {config.num_envs}")
    if config.openai.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {config.openai.concurrency}")
    if not config.max_errors >= 0:
        raise ValueError(f"max_errors must be >= 0, got {config.max_errors}")
    out_dir = Path(config.out_dir)
    own_agent = agent is None
    own_envs = envs is None
    with contextlib.ExitStack() as stack:
        try:
            if envs is None:
                envs = make_group_envs(
                    config.env_id,
                    config.copies(),
                    vector_mode=config.vector_mode,
                    server_url=config.env_url,
                    **config.env_arguments(),
                )
            elif config.num_envs is not None and envs.num_envs != config.num_envs:
                raise ValueError(f"envs has {envs.num_envs} copies but config.num_envs is {config.num_envs}")
            kind = config.kind(envs)  # the style the env names (a remote env: the hosted one's)
            _check_resume(out_dir, config, kind)
            agent = agent or build_agent(config)
            split_size = num_tasks(envs)
            played_split = config.split or split_name(envs)  # the report names the split the env played
            episodes = split_size if config.episodes is None else int(config.episodes)
            if not 0 < episodes <= split_size:
                raise ValueError(
                    f"--episodes must be in 1..{split_size} (tasks in the split), got {episodes}"
                )
            stack.enter_context(folder_lock(out_dir, "progpo eval", "give another --out"))
            _record_settings(out_dir, config, kind)
            trajectories = out_dir / TRAJECTORIES_FILE
            finished = load_finished(trajectories)
            selected = sorted(task_selection(envs, episodes, TaskOrder(config.task_order)))
            remaining = [t for t in selected if t not in finished]
            allowed = config.allowed_errors(episodes)
            bar = tqdm(
                total=episodes,
                initial=episodes - len(remaining),
                desc=f"eval {config.env_id}",
                unit="ep",
                disable=not progress,
            )
            stack.callback(bar.close)  # however the run ends, so that Ctrl-C's line starts on its own line
            errors = 0
            with trajectories.open("a", encoding="utf-8") as sink:
                for start in range(0, len(remaining), envs.num_envs):
                    if errors > allowed:  # the run has failed already: do not start more episodes
                        break
                    batch = remaining[start : start + envs.num_envs]
                    for record in _play_batch(envs, agent, kind, batch, config):
                        sink.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
                        sink.flush()
                        finished[record["task_index"]] = record
                        errors += record.get("error") is not None
                        bar.update(1)
            bar.close()  # before the summary is printed
            servers = server_status(envs)
        except RemoteEnvError as error:
            refused = refused_kwarg(error.message) if error.status == 400 else None
            if refused is not None and refused[0] == "expert":
                raise ValueError(expert_refused(error.message, refused[1])) from error
            raise
        finally:
            if own_envs and envs is not None:
                envs.close()
            if own_agent and agent is not None:
                agent.close()
        records = [finished[t] for t in selected if t in finished]
        summary_config = dataclasses.replace(config, split=played_split)
        return write_reports(
            out_dir, records, summary_config, planned=episodes, allowed_errors=allowed, servers=servers
        )


def expert_refused(message: str, env_id: str) -> str:
    """What to do when an env server refused the expert agent's ``expert=True``: only the server's operator
    turns its expert on (a client may not: ``info["expert_action"]`` is the answer).

    Example:
        >>> print(expert_refused("kwarg 'expert' is not allowed for progpo/WebShop-v0 (allowed: split)",
        ...                      "progpo/WebShop-v0"))  # doctest: +NORMALIZE_WHITESPACE
        the env server refused the expert agent (kwarg 'expert' is not allowed for progpo/WebShop-v0 (allowed:
        split)): its operator turns the expert on: start it with --env-kwargs
        'progpo/WebShop-v0={"expert": true}' (docker compose: PROGPO_SERVE_EXPERT=true docker compose up), or
        play the env in this process (no --env-url)
    """
    return (
        f"the env server refused the expert agent ({message}): its operator turns the expert on: start it "
        f"with --env-kwargs '{env_id}={json.dumps({'expert': True})}' (docker compose: "
        "PROGPO_SERVE_EXPERT=true docker compose up), or play the env in this process (no --env-url)"
    )


def _play_batch(
    envs: gym.vector.VectorEnv, agent: Agent, kind: str, batch: list[int], config: EvalConfig
) -> Iterator[dict[str, Any]]:
    """Play one batch of tasks; yields each episode's record as soon as it ends."""
    num_envs = envs.num_envs
    padded = batch + [batch[-1]] * (num_envs - len(batch))
    playing = [i < len(batch) for i in range(num_envs)]
    episodes: dict[int, _Episode] = {}
    seeds = [config.seed + t for t in padded]  # task t is always reset with seed + t
    for vector_step in play_episodes(envs, agent, kind, seed=seeds, task_indices=padded, playing=playing):
        for t in vector_step.transitions:
            episode = episodes.get(t.slot)
            if episode is None:
                episode = episodes[t.slot] = _Episode(t.task, t.observation, t.info)
            episode.add(t.decision, t.reward, t.terminated, t.truncated, t.next_observation, t.next_info)
            if t.done:  # an env server lost under the episode ends it as an error, as an agent's failure does
                yield episode.record(error=t.next_info.get("env_error"))
        for failure in vector_step.failures:  # the agent could not decide: the episode ends as an error
            episode = episodes.get(failure.slot) or _Episode(failure.task, failure.observation, failure.info)
            yield episode.record(error=failure.error)
