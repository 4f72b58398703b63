"""ALFWorld and WebShop as environments for TRL's ``GRPOTrainer(environment_factory=...)``.

TRL (``trl`` 1.x, "Agent Training") makes one instance of the class per rollout, calls ``reset(**row)`` with
the dataset row (the returned text is appended to the prompt's last user message), exposes the instance's
public methods as tools (their docstrings, with ``Args:``, become the tool schema) and scores the rollout
with ``get_reward()``. TRL warns that the G rollouts of a group must share their start state; here
``reset`` derives it from the row only (``task_index``, ``split`` and ``seed``), so every rollout of a row
plays the same task from the same first observation.

* :class:`ALFWorldToolEnv` — one tool, ``act(command)``: the command's outcome, the task's line again, then
  the commands admissible next;
* :class:`WebShopToolEnv` — ``search(query)`` and ``click(target)``: the page, then what can be clicked;
* both: ``get_reward()`` is the env's own return (the sum of its rewards: 10 for a solved task by default);
  a tool called after the episode ended raises ``ValueError`` (TRL hands the message to the model); a
  command the env cannot execute is the env's invalid action, answered like any other.

Where the episodes run (the constructor's ``server`` and ``protocol``): in this process (``server=None``,
``gymnasium.make`` with ``env_kwargs``), against an OpenEnv server (``progpo serve --protocol openenv``, or
any OpenEnv server of these envs: ``protocol="openenv"``, through OpenEnv's ``GenericEnvClient``) or against
our native env server (``progpo serve``: ``protocol="native"``, through ``progpo/Remote-v0``). ``server`` may
name several servers of either protocol (a list, or URLs separated by commas): each instance plays on the one
where this process holds the fewest sessions, and when a server is lost the episode in flight ends (its tool
answers that the episode is over and why) and the next ``reset`` plays on a server that works
(:mod:`progpo_envs.server.fleet`; TRL makes one instance per rollout, so the rollouts spread over the
servers).

:func:`task_rows` yields the dataset rows of a split: one row per task (``prompt``, ``task_index``,
``split``, ``seed``), ``repeats`` times over; GRPO itself repeats each row ``num_generations`` times.

Example:
    >>> env = ALFWorldToolEnv()
    >>> first = env.reset(task_index=0, split="train")
    >>> "Your task is to:" in first and "Admissible commands:" in first
    True
    >>> rows = list(task_rows(env, "train", limit=2))
    >>> [row["task_index"] for row in rows], rows[0]["prompt"][0]["role"]
    ([0, 1], 'user')
    >>> env.get_reward()
    0.0

Training (see docs/hosting.md, "OpenEnv", for a run against a server)::

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    dataset = Dataset.from_list(list(task_rows(ALFWorldToolEnv(), "train")))
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=dataset,
                          environment_factory=ALFWorldToolEnv)
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.server.fleet import FleetServer, ServerState, fleet_for, server_urls
from webshop_server.engine import admissible_actions

ALFWORLD_ENV_ID = "progpo/ALFWorld-v0"
WEBSHOP_ENV_ID = "progpo/WebShop-v0"
#: Where the episodes run when a ``server`` is given.
PROTOCOLS = ("openenv", "native")
#: Seconds a hosted env may take to answer one call.
DEFAULT_TIMEOUT_S = 120.0


class _Episode:
    """What a backend answers: the text, the env's view of the state, the reward and whether it ended."""

    __slots__ = ("text", "view", "reward", "done")

    def __init__(self, text: str, view: Mapping[str, Any], reward: float = 0.0, done: bool = False):
        self.text, self.view, self.reward, self.done = text, view, float(reward or 0.0), bool(done)


class _InProcess:
    """The env in this process, one per split (``gymnasium.make``)."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.envs: dict[str, gym.Env] = {}
        self.env: gym.Env | None = None

    def _env(self, split: str) -> gym.Env:
        if split not in self.envs:
            self.envs[split] = gym.make(self.env_id, **{**self.env_kwargs, "split": split})
        return self.envs[split]

    def num_tasks(self, split: str) -> int:
        return int(self._env(split).unwrapped.num_tasks)

    def reset(self, task_index: int, split: str, seed: int | None) -> _Episode:
        self.env = self._env(split)
        text, info = self.env.reset(seed=seed, options={"task_index": task_index})
        return _Episode(text, info)

    def step(self, command: str) -> _Episode:
        text, reward, terminated, truncated, info = self.env.step(command)
        return _Episode(text, info, reward, terminated or truncated)

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


class _Native(_InProcess):
    """Our env server (``progpo serve``) through ``progpo/Remote-v0``, one remote instance per split (over
    several servers: placed by load, and a lost server ends the episode, ``info["env_error"]``)."""

    def __init__(
        self, url: str | Sequence[str], env_id: str, env_kwargs: Mapping[str, Any], timeout_s: float
    ):
        super().__init__(REMOTE_ENV_ID, {**env_kwargs, "url": url, "env_id": env_id, "timeout": timeout_s})


class _OpenEnv:
    """An OpenEnv server of the env through OpenEnv's ``GenericEnvClient`` (one WebSocket session)."""

    def __init__(self, url: str, env_kwargs: Mapping[str, Any], timeout_s: float):
        from openenv import GenericEnvClient

        self.env_kwargs = dict(env_kwargs)
        self.client = GenericEnvClient(base_url=url, message_timeout_s=timeout_s).sync()
        self.sizes: dict[str, int] = {}

    def num_tasks(self, split: str) -> int:
        if split not in self.sizes:
            self.sizes[split] = int(self.reset(0, split, None).view["num_tasks"])
        return self.sizes[split]

    def reset(self, task_index: int, split: str, seed: int | None) -> _Episode:
        result = self.client.reset(seed=seed, task_index=task_index, split=split, **self.env_kwargs)
        return _Episode(result.observation["text"], result.observation)

    def step(self, command: str) -> _Episode:
        result = self.client.step({"command": command})
        return _Episode(result.observation["text"], result.observation, result.reward, result.done)

    def close(self) -> None:
        self.client.close()


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
        self.last: _Episode | None = None
        self._connect(self.fleet.choose())

    def _connect(self, server: FleetServer) -> None:
        from openenv import GenericEnvClient

        self.client = GenericEnvClient(base_url=server.url, message_timeout_s=self.timeout_s).sync()
        self.server, self.lost = server, False
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

    def reset(self, task_index: int, split: str, seed: int | None) -> _Episode:
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

    def step(self, command: str) -> _Episode:
        if not self.lost:
            try:
                self.last = super().step(command)
                return self.last
            except Exception as exc:  # noqa: BLE001 - classified: a server's failure ends the episode
                self._failed(exc)
                self.fleet.count(self.server, failed_episodes=1)
                error = f"env server {self.server.url} lost: {type(exc).__name__}: {exc}"
                self.last = _Episode(self.last.text, {**self.last.view, "env_error": error}, 0.0, True)
        return self.last

    def close(self) -> None:
        self._disconnect()


def _backend(
    env_id: str,
    server: str | Sequence[str] | None,
    protocol: str,
    env_kwargs: Mapping[str, Any],
    timeout_s: float,
):
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


def _close(backend: Any) -> None:
    try:
        backend.close()
    except Exception:  # noqa: BLE001,S110 - the interpreter may be exiting; nothing to report to
        pass


class _TextToolEnv:
    """What both tool envs share: the backend, ``reset(**row)``, the return, the episode's end."""

    env_id: str
    #: What the model is told to do (the first line of every row's prompt).
    instruction: str

    def __init__(
        self,
        server: str | Sequence[str] | None = None,
        protocol: str = "openenv",
        split: str = "train",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **env_kwargs: Any,
    ):
        self._split = split
        self._backend = _backend(self.env_id, server, protocol, env_kwargs, timeout_s)
        weakref.finalize(self, _close, self._backend)
        #: The env's view of the state after the last ``reset`` or tool call (an attribute, so TRL does not
        #: take it for a tool): ``admissible_actions``, ``won``, and ``expert_action`` when the env (or the
        #: server's operator) has the expert on: what an SFT warm start on the expert's plays reads.
        self.last_view: Mapping[str, Any] = {}
        self._return = 0.0
        self._done = True
        self._won = False

    def reset(
        self, task_index: int | None = None, split: str | None = None, seed: int | None = 0, **row: Any
    ):
        """Start the row's task: ``task_index`` of ``split`` (default: the constructor's), seeded by ``seed``.

        Every other column of the row (``prompt``, ...) is ignored; the same row always gives the same first
        observation, so a GRPO group shares its task. Returns the first observation for the prompt.
        """
        if task_index is None:
            raise ValueError("the dataset row needs a task_index column (agents.trl.task_rows makes one)")
        episode = self._backend.reset(int(task_index), split or self._split, seed)
        self.last_view = episode.view
        self._return, self._done, self._won = 0.0, False, False
        return self._render(episode)

    def get_reward(self) -> float:
        """The env's return for the episode (the sum of its rewards)."""
        return self._return

    @property
    def done(self) -> bool:
        """Whether the episode is over (won, or the env's step limit); a tool called then raises. A property,
        so TRL does not take it for a tool."""
        return self._done

    def _apply(self, command: str) -> str:
        if self._done:
            raise ValueError("The episode is over; no more actions can be taken.")
        episode = self._backend.step(command)
        self.last_view = episode.view
        self._return += episode.reward
        self._done, self._won = episode.done, bool(episode.view.get("won", False))
        return self._render(episode)

    def _render(self, episode: _Episode) -> str:
        if episode.done and episode.view.get("env_error"):  # its env server was lost under it
            lost = episode.view["env_error"]
            return f"{episode.text}\n\nThe episode is over: the env server was lost ({lost})."
        if episode.done:
            outcome = "the task is solved" if self._won else "the task is not solved"
            return f"{episode.text}\n\nThe episode is over: {outcome}."
        return f"{episode.text}\n\n{self._actions_line(episode.view)}"

    def _actions_line(self, view: Mapping[str, Any]) -> str:
        raise NotImplementedError


class ALFWorldToolEnv(_TextToolEnv):
    """ALFWorld's household tasks as a TRL environment: one tool, :meth:`act`.

    Args:
        server: URL of a server hosting ``progpo/ALFWorld-v0``, or several (a list, or separated by commas:
            see the module docstring); ``None``: play in this process.
        protocol: ``"openenv"`` (``progpo serve --protocol openenv``) or ``"native"`` (``progpo serve``).
        split: The split played when a row names none.
        timeout_s: Seconds a hosted env may take to answer.
        restate_task: Repeat the task's line ("Your task is to: ...") in every answer of :meth:`act`, just
            before the admissible commands (the first observation states it once, and in a long episode it
            ends up thousands of tokens back: a small model then no longer reads it; the quickstart's
            ``compact`` prompt puts the task last for the same reason).
        **env_kwargs: Constructor kwargs of the env (in this process; for a server: those it allows).
    """

    env_id = ALFWORLD_ENV_ID
    instruction = (
        "You are in a household. Solve the task described below by calling the `act` tool with one "
        "admissible command at a time."
    )

    def __init__(
        self,
        server: str | None = None,
        protocol: str = "openenv",
        split: str = "train",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        restate_task: bool = True,
        **env_kwargs: Any,
    ):
        super().__init__(server, protocol, split, timeout_s, **env_kwargs)
        self._restate_task = restate_task
        self._task_line: str | None = None

    def reset(
        self, task_index: int | None = None, split: str | None = None, seed: int | None = 0, **row: Any
    ):
        """Start the row's task: ``task_index`` of ``split`` (default: the constructor's), seeded by ``seed``.

        Every other column of the row (``prompt``, ...) is ignored; the same row always gives the same first
        observation, so a GRPO group shares its task. Returns the first observation for the prompt.
        """
        self._task_line = None
        first = super().reset(task_index, split, seed, **row)
        found = re.search(r"^Your task is to: .*$", first, re.M)
        self._task_line = found.group(0) if found and self._restate_task else None
        return first

    def act(self, command: str) -> str:
        """Carry out one command in the household, e.g. "go to desk 1" or "take mug 1 from desk 1".

        Args:
            command: One of the admissible commands listed after the last observation.

        Returns:
            What happened, the task again, then the commands admissible next (or that the episode is over).
        """
        return self._apply(command)

    def _actions_line(self, view: Mapping[str, Any]) -> str:
        commands = "Admissible commands: " + ", ".join(view.get("admissible_actions") or [])
        return commands if self._task_line is None else f"{self._task_line}\n{commands}"


class WebShopToolEnv(_TextToolEnv):
    """WebShop's shopping tasks as a TRL environment: the tools :meth:`search` and :meth:`click`.

    Args:
        server: URL of a server hosting ``progpo/WebShop-v0``, or several (a list, or separated by commas:
            see the module docstring); ``None``: play in this process.
        protocol: ``"openenv"`` (``progpo serve --protocol openenv``) or ``"native"`` (``progpo serve``).
        split: The split played when a row names none (``train``, ``test`` or ``all``).
        timeout_s: Seconds a hosted env may take to answer.
        **env_kwargs: Constructor kwargs of the env (in this process, e.g. ``num_products``; for a server:
            those it allows).
    """

    env_id = WEBSHOP_ENV_ID
    instruction = (
        "You are shopping in a web shop. Buy the product the instruction below asks for: call `search` "
        "with a query on the search page and `click` on a link, an option or a button elsewhere."
    )

    def search(self, query: str) -> str:
        """Search the shop (only on a page with a search bar).

        Args:
            query: What to search for, e.g. "blue cotton socks under 20 dollars".

        Returns:
            The result page, then what can be clicked on it.
        """
        return self._apply(f"search[{query}]")

    def click(self, target: str) -> str:
        """Click a link, an option or a button of the current page, e.g. "buy now" or "< prev".

        Args:
            target: One of the clickable names listed after the last page.

        Returns:
            The next page, then what can be clicked on it (or that the episode is over).
        """
        return self._apply(f"click[{target}]")

    def _actions_line(self, view: Mapping[str, Any]) -> str:
        return "Available actions: " + ", ".join(admissible_actions(view["available_actions"]))


def task_rows(
    env: _TextToolEnv, split: str, repeats: int = 1, seed: int = 0, limit: int | None = None
) -> Iterator[dict]:
    """The dataset rows of ``split`` for ``env``'s class: one per task, ``repeats`` times over.

    Each row is ``{"prompt": [{"role": "user", "content": instruction + "\\n\\n"}], "task_index", "split",
    "seed"}``; ``reset(**row)``'s first observation is appended to that content (TRL adds it as it is, so the
    blank line keeps the instruction and the observation apart).

    Args:
        env: A tool env (it tells how many tasks the split has).
        split: The split.
        repeats: Passes over the split.
        seed: The reset seed of every row.
        limit: Only the first ``limit`` tasks.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    count = env._backend.num_tasks(split)
    count = count if limit is None else min(count, limit)
    prompt = [{"role": "user", "content": env.instruction + "\n\n"}]
    for _ in range(repeats):
        for task_index in range(count):
            yield {"prompt": prompt, "task_index": task_index, "split": split, "seed": seed}
