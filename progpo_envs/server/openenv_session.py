"""An OpenEnv ``Environment`` whose episodes run in the env pool: one session, one pool instance.

OpenEnv's server (:func:`openenv.core.env_server.http_server.create_app`) builds one ``Environment`` per
WebSocket session from a factory and calls its ``reset``/``step``/``state``/``close``. :class:`PoolSession` is
that environment for our hosted envs: it holds no env itself, it forwards to an instance in the
:class:`~progpo_envs.server.pool.EnvPool` worker processes, so the episodes keep the pool's limits, worker
supervision, idle expiry and drain, and the web server's process never runs an env.

``reset(seed=None, episode_id=None, task_index=None, split=None, **env_kwargs)``:

* ``task_index`` plays that task of the split (``options={"task_index": i}`` of the Gymnasium env); without it
  ``seed`` picks one with the env's seeded generator; the same arguments give the same first observation in
  every session (a trainer's group shares its start state);
* ``split`` and any other constructor kwarg the operator allows (``max_steps``, ``history_depths``, ...; the
  same allow-list as the native protocol, :mod:`~progpo_envs.server.policy`) choose the env: the first reset,
  or one with other kwargs, builds the pool instance; a reset with the same kwargs reuses it;
* a name that is neither, or a value the policy refuses, is an error naming what is allowed.

Errors are :class:`SessionError` with the HTTP status the native protocol gives the same fault: OpenEnv's
WebSocket loop answers them as ``EXECUTION_ERROR`` (the connection stays), the HTTP routes as that status
(:mod:`~progpo_envs.server.openenv_app`). An instance lost with its worker (410) is forgotten, so the
session's next reset builds a new one on a live worker; sessions on the other workers never notice.

The address of the client (for the pool's per-client share) comes from :data:`CLIENT_ADDRESS`, which the app's
ASGI middleware sets for the connection; the blocking pool calls run on the host's thread pool, never on the
event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

import progpo_envs
from progpo_envs.server.codec import decode, encode
from progpo_envs.server.openenv_models import (
    CommandAction,
    TextEnvState,
    TextObservation,
    observation_of,
)
from progpo_envs.server.policy import PolicyError
from progpo_envs.server.pool import EnvPool, ServerError

#: The client address of the connection being served (set by the app's middleware; ``None`` in-process).
CLIENT_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("openenv_client", default=None)
_LOST = 410


class SessionError(Exception):
    """A session call that cannot be served, with the HTTP status the native protocol gives it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass
class SessionHost:
    """What every session of one hosted env shares: the pool, the env id, the models, the thread pool.

    Attributes:
        pool: The env pool the episodes run in.
        env_id: The hosted env.
        executor: Threads that wait on the pool's workers (the event loop never blocks).
        metadata: What ``/metadata`` answers.
        observation_cls: The observation model the env asks for
            (:func:`~progpo_envs.server.openenv_models.observation_class`).
    """

    pool: EnvPool
    env_id: str
    executor: ThreadPoolExecutor
    metadata: EnvironmentMetadata
    observation_cls: type[TextObservation]


def check_reset_types(args: Mapping[str, Any]) -> None:
    """The types of a reset's ``seed``, ``task_index`` and ``episode_id`` as sent (:class:`SessionError` 422
    otherwise): integers or null, a string or null. Both doors read them strictly: the WebSocket ``reset``
    hands them over as sent, and the stateless HTTP ``/reset`` checks its raw body with this before OpenEnv's
    request model would turn ``"3"`` or ``true`` into a seed."""
    for name in ("seed", "task_index"):
        value = args.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SessionError(422, f"{name} must be null or an integer, got {_shown(value)}")
    episode_id = args.get("episode_id")
    if episode_id is not None and not isinstance(episode_id, str):
        raise SessionError(422, f"episode_id must be null or a string, got {_shown(episode_id)}")


def _shown(value: Any) -> str:
    """A client's value in a message: its ``repr``, cut short (a message never echoes a whole request)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _task_index_arg(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SessionError(400, f"task_index must be null or an integer >= 0, got {_shown(value)}")
    return value


def _seed_arg(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise SessionError(400, f"seed must be null or an integer in [0, 2**64), got {_shown(value)}")
    return value


class PoolSession(Environment):
    """One OpenEnv session on a pool instance (see the module docstring).

    Args:
        host: The hosted env's shared pieces (a factory binds it: ``functools.partial(PoolSession, host)``).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, host: SessionHost):
        super().__init__()
        self.host = host
        self._instance: str | None = None
        self._kwargs: dict[str, Any] | None = None
        self._num_tasks: int | None = None
        self._state = TextEnvState(env_id=host.env_id)

    # --- OpenEnv's interface -------------------------------------------------------------------------------
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_index: int | None = None,
        split: str | None = None,
        **env_kwargs: Any,
    ) -> TextObservation:
        """Start an episode (blocking; the server calls :meth:`reset_async`)."""
        return self._reset(seed, episode_id, task_index, split, env_kwargs, CLIENT_ADDRESS.get())

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_index: int | None = None,
        split: str | None = None,
        **env_kwargs: Any,
    ) -> TextObservation:
        """Start an episode: the pool calls run on the host's threads."""
        client = CLIENT_ADDRESS.get()
        return await self._off_loop(self._reset, seed, episode_id, task_index, split, env_kwargs, client)

    def step(self, action: CommandAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """Apply ``action.command`` (blocking; the server calls :meth:`step_async`)."""
        return self._step(action)

    async def step_async(
        self, action: CommandAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TextObservation:
        """Apply ``action.command``: the pool call runs on the host's threads."""
        return await self._off_loop(self._step, action)

    @property
    def state(self) -> TextEnvState:
        """Episode id, steps taken, the task and whether the episode ended."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The env, its splits and task types (``/metadata``)."""
        return self.host.metadata

    def expert_action(self) -> str | None:
        """The expert's next command in this session's episode (blocking; ``GET /expert`` awaits
        :meth:`expert_action_async`): :class:`SessionError` 409 when the env has no expert or no episode
        started."""
        if self._instance is None:
            raise SessionError(409, "the session has no episode: reset it first")
        return self._call("expert", {})["expert_action"]

    async def expert_action_async(self) -> str | None:
        """:meth:`expert_action` on the host's threads."""
        return await self._off_loop(self.expert_action)

    def close(self) -> None:
        """Close the pool instance (OpenEnv calls this when the session ends or expires)."""
        instance, self._instance = self._instance, None
        if instance is not None:
            try:
                self.host.pool.close_instance(instance)
            except ServerError:
                pass  # expired, or lost with its worker: gone either way

    # --- the pool ----------------------------------------------------------------------------------------
    async def _off_loop(self, function, *args) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.host.executor, function, *args)

    def _reset(
        self,
        seed: Any,
        episode_id: Any,
        task_index: Any,
        split: Any,
        env_kwargs: Mapping[str, Any],
        client: str | None,
    ) -> TextObservation:
        check_reset_types({"seed": seed, "task_index": task_index, "episode_id": episode_id})
        options = {"task_index": _task_index_arg(task_index)}
        seed = _seed_arg(seed)
        kwargs = dict(env_kwargs)
        if split is not None:
            kwargs["split"] = split
        if self._instance is None or kwargs != self._kwargs:
            self.close()
            try:
                # the policy checks every name and value (codec-encoded, as the native API sends them)
                self._instance, meta = self.host.pool.create(self.host.env_id, encode(kwargs), client=client)
            except PolicyError as exc:
                raise SessionError(400, f"reset: {exc}") from None
            except ServerError as exc:
                raise SessionError(exc.status, exc.message) from None
            self._kwargs, self._num_tasks = kwargs, meta.get("num_tasks")
        answer = self._call("reset", {"seed": seed, "options": options})
        info = decode(answer["info"])
        self._state = TextEnvState(
            env_id=self.host.env_id,
            episode_id=episode_id or str(uuid.uuid4()),
            step_count=0,
            task_index=int(info["task_index"]),
            task_id=str(info["task_id"]),
        )
        return observation_of(
            self.host.observation_cls, answer["observation"], info, num_tasks=self._num_tasks
        )

    def _step(self, action: CommandAction) -> TextObservation:
        if self._instance is None:
            raise SessionError(
                409,
                "call reset before step (OpenEnv's HTTP /step is stateless: play episodes over /ws)",
            )
        answer = self._call("step", {"action": action.command})
        info = decode(answer["info"])
        terminated, truncated = bool(answer["terminated"]), bool(answer["truncated"])
        self._state.step_count += 1
        self._state.done = terminated or truncated
        return observation_of(
            self.host.observation_cls,
            answer["observation"],
            info,
            reward=decode(answer["reward"]),
            terminated=terminated,
            truncated=truncated,
            num_tasks=self._num_tasks,
        )

    def _call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.host.pool.call(self._instance, op, args)
        except ServerError as exc:
            if exc.status in (_LOST, 404):  # lost with its worker, or expired: the next reset makes a new one
                self._instance = None
            raise SessionError(exc.status, exc.message) from None


def environment_metadata(
    env_id: str, splits: tuple[str, ...] | None, task_types: tuple[str, ...], fixed_split: str | None = None
) -> EnvironmentMetadata:
    """``/metadata`` for a hosted env: its id, what it is, its splits and task types (in the description and
    the readme: OpenEnv's metadata model has no other fields); ``fixed_split``: the one the operator fixed."""
    split_text = ", ".join(splits) if splits else "any plain name"
    if fixed_split is not None:
        split_text += f" (this server plays {fixed_split}, fixed by its operator)"
    type_text = ", ".join(task_types) if task_types else "none (one task family)"
    description = (
        f"{env_id} (ProGPO suite) as an OpenEnv environment. Splits: {split_text}. Task types: {type_text}. "
        "Reset with seed, task_index and split; act with {'command': str}."
    )
    readme = "\n".join(
        [
            f"# {env_id}",
            "",
            "Served by `progpo serve --protocol openenv`; the episodes run in the env server's worker pool.",
            "",
            f"- splits: {split_text}",
            f"- task types: {type_text}",
            "- reset: `seed`, `task_index` (a task of the split), `split`, and kwargs the operator allows",
            '- action: `{"command": str}` (anything the env cannot execute is an invalid action)',
            "- observation: `text`, the env's actions, `obs_hash`, `history_key`, `task_id`, `task_type`, "
            "`won`, `task_score` (see `/schema`)",
        ]
    )
    return EnvironmentMetadata(
        name=env_id,
        description=description,
        readme_content=readme,
        version=progpo_envs.__version__,
        author="ProGPO suite",
    )
