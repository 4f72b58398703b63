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
* both: the text the model sees never holds the expert's next command, wherever the env runs;
  :func:`expert_command` reads it apart (an SFT warm start on the expert's plays);
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

from agents.hosted import DEFAULT_TIMEOUT_S, Episode, close_quietly, open_backend
from webshop_server.engine import admissible_actions

ALFWORLD_ENV_ID = "progpo/ALFWorld-v0"
WEBSHOP_ENV_ID = "progpo/WebShop-v0"


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
        self._backend = open_backend(self.env_id, server, protocol, env_kwargs, timeout_s)
        weakref.finalize(self, close_quietly, self._backend)
        #: The env's view of the state after the last ``reset`` or tool call (an attribute, so TRL does not
        #: take it for a tool): ``admissible_actions``, ``won``, ... Never the expert's next command: an SFT
        #: warm start on the expert's plays reads that with :func:`expert_command`.
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

    def _render(self, episode: Episode) -> str:
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


def expert_command(env: _TextToolEnv) -> str | None:
    """The expert's next command in ``env``'s episode (``None`` once it has none), read apart from what the
    model sees (a function, not a method: TRL would offer a public method to the model as a tool). The env
    must have the expert on: in process ``expert=True``; on a server, the operator's ``expert: true`` (the
    native protocol also needs ``expert=True`` here, which such a server allows).

    Example:
        >>> env = ALFWorldToolEnv(expert=True)
        >>> first = env.reset(task_index=0, split="train")
        >>> expert_command(env) in env.last_view["admissible_actions"]
        True
    """
    return env._backend.expert()


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
