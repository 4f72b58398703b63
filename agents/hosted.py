"""One episode at a time on ALFWorld or WebShop, wherever the env runs: what the trainers' env classes play
through (:mod:`agents.trl` for TRL, :mod:`agents.skyrl` for SkyRL).

:func:`open_backend` picks where the episodes run: in this process (``server=None``, ``gymnasium.make``),
on an OpenEnv server (``protocol="openenv"``: ``progpo serve --protocol openenv`` or any OpenEnv server of
these envs, through OpenEnv's own ``GenericEnvClient``) or on our native env server (``protocol="native"``,
through ``progpo/Remote-v0``). ``server`` may name several servers of either protocol (a list, or URLs
separated by commas): each backend plays on the one where this process holds the fewest sessions, and when a
server is lost the episode in flight ends (its last :class:`Episode` says so in ``view["env_error"]``) and
the next ``reset`` plays on a server that works (:mod:`progpo_envs.server.fleet`).

Every backend answers with an :class:`Episode`: the text, the env's view of the state (``admissible_actions``
or ``available_actions``, ``won``, ``task_score``, ...), the reward and whether the episode ended. The view
never holds the expert's next command: a trainer that shows its policy the view must not show it the
answer. :meth:`HostedBackend.expert` reads it apart, where the env has the expert on (in process and on the
native server: ``expert=True``, the server's operator allowing it; on an OpenEnv server: the operator's
``expert: true``, read from the server's ``GET /expert`` route for the backend's own episode id).

Example:
    >>> backend = open_backend("progpo/ALFWorld-v0", None, "openenv", {"expert": True}, 60.0)
    >>> episode = backend.reset(0, "train", 0)
    >>> "expert_action" in episode.view, backend.expert() in episode.view["admissible_actions"]
    (False, True)
    >>> backend.close()
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import gymnasium as gym

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.core.http_client import DeadlineSession
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.fleet import FleetServer, ServerState, fleet_for, server_urls

#: Where the episodes run when a ``server`` is given.
PROTOCOLS = ("openenv", "native")
#: Seconds a hosted env may take to answer one call.
DEFAULT_TIMEOUT_S = 120.0
#: The info key of the expert's next command, which an :class:`Episode`'s view never holds.
EXPERT_KEY = "expert_action"


class Episode:
    """What a backend answers: the text, the env's view of the state (never the expert's command), the
    reward and whether the episode ended."""

    __slots__ = ("text", "view", "reward", "done")

    def __init__(self, text: str, view: Mapping[str, Any], reward: float = 0.0, done: bool = False):
        self.text, self.view, self.reward, self.done = text, view, float(reward or 0.0), bool(done)


class HostedBackend(Protocol):
    """What :func:`open_backend` returns."""

    def num_tasks(self, split: str) -> int:
        """Tasks in ``split``."""

    def reset(self, task_index: int, split: str, seed: int | None) -> Episode:
        """Start task ``task_index`` of ``split`` (the same arguments, the same first observation)."""

    def step(self, command: str) -> Episode:
        """Apply one command (one the env cannot execute is its invalid action)."""

    def expert(self) -> str | None:
        """The expert's next command (``None`` once it has none); raises where the env has no expert."""

    def close(self) -> None:
        """Release the env or the session."""


def _without_expert(info: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    view = dict(info)
    return view, view.pop(EXPERT_KEY, None)


class _InProcess:
    """The env in this process, one per split (``gymnasium.make``)."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.envs: dict[str, gym.Env] = {}
        self.env: gym.Env | None = None
        self._expert: str | None = None

    def _env(self, split: str) -> gym.Env:
        if split not in self.envs:
            self.envs[split] = gym.make(self.env_id, **{**self.env_kwargs, "split": split})
        return self.envs[split]

    def num_tasks(self, split: str) -> int:
        return int(self._env(split).unwrapped.num_tasks)

    def reset(self, task_index: int, split: str, seed: int | None) -> Episode:
        self.env = self._env(split)
        text, info = self.env.reset(seed=seed, options={"task_index": task_index})
        view, self._expert = _without_expert(info)
        return Episode(text, view)

    def step(self, command: str) -> Episode:
        text, reward, terminated, truncated, info = self.env.step(command)
        view, self._expert = _without_expert(info)
        return Episode(text, view, reward, terminated or truncated)

    def expert(self) -> str | None:
        if not self.env_kwargs.get("expert"):
            raise RuntimeError("this env has no expert: make it with expert=True")
        return self._expert

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


class _Native(_InProcess):
    """Our env server (``progpo serve``) through ``progpo/Remote-v0``, one remote instance per split (over
    several servers: placed by load, and a lost server ends the episode, ``info["env_error"]``); with
    ``expert=True`` the remote env reads the expert from the server's expert route."""

    def __init__(
        self, url: str | Sequence[str], env_id: str, env_kwargs: Mapping[str, Any], timeout_s: float
    ):
        super().__init__(REMOTE_ENV_ID, {**env_kwargs, "url": url, "env_id": env_id, "timeout": timeout_s})


class _OpenEnv:
    """An OpenEnv server of the env through OpenEnv's ``GenericEnvClient`` (one WebSocket session); every
    reset names a fresh episode id, by which :meth:`expert` asks the server's ``GET /expert``."""

    def __init__(self, url: str, env_kwargs: Mapping[str, Any], timeout_s: float):
        from openenv import GenericEnvClient

        self.env_kwargs, self.timeout_s, self.url = dict(env_kwargs), timeout_s, url.rstrip("/")
        self.client = GenericEnvClient(base_url=url, message_timeout_s=timeout_s).sync()
        self.sizes: dict[str, int] = {}
        self.episode_id: str | None = None
        self._http: DeadlineSession | None = None

    def num_tasks(self, split: str) -> int:
        if split not in self.sizes:
            self.sizes[split] = int(self.reset(0, split, None).view["num_tasks"])
        return self.sizes[split]

    def reset(self, task_index: int, split: str, seed: int | None) -> Episode:
        self.episode_id = uuid.uuid4().hex
        result = self.client.reset(
            seed=seed, task_index=task_index, split=split, episode_id=self.episode_id, **self.env_kwargs
        )
        return Episode(result.observation["text"], _without_expert(result.observation)[0])

    def step(self, command: str) -> Episode:
        result = self.client.step({"command": command})
        view = _without_expert(result.observation)[0]
        return Episode(result.observation["text"], view, result.reward, result.done)

    def expert(self) -> str | None:
        if self.episode_id is None:
            raise RuntimeError("no episode yet: reset first")
        if self._http is None:
            self._http = DeadlineSession(deadline=self.timeout_s)
        answer = self._http.get(f"{self.url}/expert", params={"episode_id": self.episode_id})
        if answer.status_code != 200:
            status, text = answer.status_code, answer.text[:300]
            raise RuntimeError(f"the OpenEnv server's expert route answered {status}: {text}")
        return answer.json()[EXPERT_KEY]

    def close(self) -> None:
        self.client.close()
        if self._http is not None:
            self._http.close()


def _openenv_failure(exc: Exception) -> ServerState | None:
    """What an OpenEnv client's error says of its server: down (no connection, closed, no answer), full
    (``CAPACITY_REACHED``), up but the session lost (``instance lost``: :attr:`ServerState.UP`), or ``None``
    (the request's own fault: raised)."""
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, (ConnectionError, ConnectionClosed, TimeoutError, OSError)):
        return ServerState.DOWN
    if isinstance(exc, RuntimeError) and "CAPACITY_REACHED" in str(exc):
        return ServerState.FULL
    if isinstance(exc, RuntimeError) and "instance lost" in str(exc):
        return ServerState.UP
    return None


class _OpenEnvFleet(_OpenEnv):
    """Several OpenEnv servers: a session on the one where this process holds the fewest, moved at a reset
    when its server is lost (a lost server ends the episode in flight)."""

    def __init__(self, urls: Sequence[str], env_kwargs: Mapping[str, Any], timeout_s: float):
        self.env_kwargs, self.timeout_s = dict(env_kwargs), timeout_s
        self.fleet = fleet_for(urls, ready_path="/health")
        self.sizes: dict[str, int] = {}
        self.server: FleetServer | None = None
        self.lost = False
        self.last: Episode | None = None
        self.episode_id: str | None = None
        self._http: DeadlineSession | None = None
        self._connect(self.fleet.choose())

    def _connect(self, server: FleetServer) -> None:
        from openenv import GenericEnvClient

        self.client = GenericEnvClient(base_url=server.url, message_timeout_s=self.timeout_s).sync()
        self.server, self.lost, self.url = server, False, server.url.rstrip("/")
        self.fleet.hold(server, 1)

    def _disconnect(self) -> None:
        if self.server is not None:
            self.fleet.hold(self.server, -1, -1)
            self.server = None
            try:
                self.client.close()
            except Exception:  # noqa: BLE001, S110 - a lost server's socket may already be gone
                pass

    def _failed(self, exc: Exception) -> None:
        state = _openenv_failure(exc)
        if state is None:
            raise exc
        self.fleet.fail(
            self.server, None if state is ServerState.UP else state, f"{type(exc).__name__}: {exc}"
        )
        self.lost = True

    def reset(self, task_index: int, split: str, seed: int | None) -> Episode:
        for _ in range(2 * len(self.fleet) + 1):
            if self.lost or self.server.state is not ServerState.UP:
                if self.lost:
                    self.fleet.count(self.server, lost_groups=1)
                self._disconnect()
                self._connect(self.fleet.choose())
            try:
                self.last = super().reset(task_index, split, seed)
                return self.last
            except Exception as exc:  # noqa: BLE001 - classified: a server's failure moves the session
                self._failed(exc)
        raise ConnectionError(f"no OpenEnv server could reset the session: {self.fleet.status()}")

    def step(self, command: str) -> Episode:
        if not self.lost:
            try:
                self.last = super().step(command)
                return self.last
            except Exception as exc:  # noqa: BLE001 - classified: a server's failure ends the episode
                self._failed(exc)
                self.fleet.count(self.server, failed_episodes=1)
                error = f"env server {self.server.url} lost: {type(exc).__name__}: {exc}"
                self.last = Episode(self.last.text, {**self.last.view, "env_error": error}, 0.0, True)
        return self.last

    def close(self) -> None:
        self._disconnect()
        if self._http is not None:
            self._http.close()


def open_backend(
    env_id: str,
    server: str | Sequence[str] | None,
    protocol: str,
    env_kwargs: Mapping[str, Any],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> HostedBackend:
    """Where ``env_id``'s episodes run (see the module docstring).

    Args:
        env_id: ``progpo/ALFWorld-v0`` or ``progpo/WebShop-v0`` (any registered text env in process).
        server: ``None`` (this process), one server's URL, or several (a list, or separated by commas).
        protocol: ``"openenv"`` or ``"native"``: what the server speaks.
        env_kwargs: Constructor kwargs of the env (in this process; for a server: those it allows).
        timeout_s: Seconds a hosted env may take to answer one call.
    """
    if server is None:
        return _InProcess(env_id, env_kwargs)
    if protocol == "openenv":
        urls = server_urls(server)
        if len(urls) > 1:
            return _OpenEnvFleet(urls, env_kwargs, timeout_s)
        return _OpenEnv(urls[0], env_kwargs, timeout_s)
    if protocol == "native":
        return _Native(server, env_id, env_kwargs, timeout_s)
    raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")


def close_quietly(backend: Any) -> None:
    """Close ``backend`` from a finalizer (the interpreter may be exiting)."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001,S110 - the interpreter may be exiting; nothing to report to
        pass
