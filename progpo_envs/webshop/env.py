"""``progpo/WebShop-v0``: the self-hosted WebShop as a Gymnasium text env.

The env talks to the shop's session API through a backend: in-process by default (it calls the page engine
directly; no HTTP, no Flask), or over HTTP against a running ``progpo webshop serve`` (``url=...``). Both give
the same observations, actions and rewards for the same catalog.

* Observation: the page in ``observation_mode`` (``text`` by default: visible texts joined by ``" [SEP] "``,
  like upstream WebShop and verl-agent).
* Actions: ``search[<query>]`` on the search page, ``click[<clickable>]`` elsewhere. Anything else, including
  malformed strings, is an invalid action: the page stays, the reward is 0 and ``info["action_valid"]`` is
  False.
* Reward (``reward_mode``): ``"success"`` (default) gives ``success_reward`` = 10 when the purchase scores
  exactly 1.0 and 0 otherwise, as in verl-agent/GiGPO; ``"raw"`` gives the raw 0–1 score on Buy Now.
* ``info``: ``available_actions`` (``{has_search_bar, clickables}``), ``admissible_actions`` (action strings;
  ``search[<query>]`` stands for any query), ``action_valid``, ``task_score`` (raw 0–1 score, 0 until bought),
  ``won`` (score == 1.0), ``goal_index`` (absolute), plus the base class's hashes and task ids; with
  ``expert=True`` also ``expert_action``.
* Tasks: the goals of ``split`` in a fixed order (:func:`webshop_server.engine.split_range`: test = goals
  0–499, train = 500+ on a full-size catalog; half and half below 1000 goals).
  ``reset(options={"task_index": i})`` plays the ``i``-th goal of the split.
* Episodes end on Buy Now (terminated) or after ``max_steps`` = 15 actions (truncated), the papers' setting.

In-process, page URLs name the session ``fixed_<goal index>`` (upstream's convention), so the copies of a task
group see identical observations in every mode; over HTTP the ``url`` mode shows each session's random id.

Example:
    >>> import gymnasium as gym, progpo_envs
    >>> env = gym.make("progpo/WebShop-v0", split="test", num_products=200)  # doctest: +SKIP
    >>> obs, info = env.reset(options={"task_index": 0})  # doctest: +SKIP
    >>> obs.startswith("WebShop [SEP] Instruction: [SEP]")  # doctest: +SKIP
    True
    >>> obs, reward, terminated, truncated, info = env.step("search[blue cotton socks]")  # doctest: +SKIP
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from progpo_envs.core.spaces import MAX_ACTION_LENGTH
from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv
from webshop_server.engine import ObservationMode, Split, WebShopEngine, admissible_actions, split_range
from webshop_server.expert import expert_action as scripted_expert_action

#: The papers' WebShop step limit (verl-agent / GiGPO use 15).
DEFAULT_MAX_STEPS = 15
#: The env reward of a fully successful purchase (verl-agent: 10 * (score == 1.0)).
SUCCESS_REWARD = 10.0


class RewardMode(str, enum.Enum):
    """How the raw 0–1 purchase score becomes the env reward."""

    SUCCESS = "success"
    RAW = "raw"


class LocalBackend:
    """The session API in this process: sessions are engine objects, the engine is shared per catalog."""

    def __init__(self, engine: WebShopEngine):
        self.engine = engine
        self._sessions: dict[str, Any] = {}
        self._next_id = 0

    @property
    def num_goals(self) -> int:
        return self.engine.num_goals

    @property
    def fingerprint(self) -> str:
        return str(self.engine.catalog.fingerprint)

    def create(self, goal_index: int) -> tuple[str, str]:
        session = self.engine.new_session(goal_index)
        self._next_id += 1
        key = str(self._next_id)
        self._sessions[key] = session
        return key, self.engine.instruction(session)

    def observe(self, sid: str, mode: ObservationMode) -> tuple[str, dict]:
        session = self._sessions[sid]
        return self.engine.observation(session, mode), self.engine.available_actions(session)

    def step(self, sid: str, action: str, mode: ObservationMode) -> dict:
        session = self._sessions[sid]
        outcome = self.engine.step(session, action)
        observation, available = self.observe(sid, mode)
        return {
            "observation": observation,
            "available_actions": available,
            "valid": outcome.valid,
            "score": outcome.score,
            "done": outcome.done,
        }

    def expert_action(self, sid: str) -> str | None:
        return scripted_expert_action(self.engine, self._sessions[sid])

    def close_session(self, sid: str) -> None:
        self._sessions.pop(sid, None)

    def close(self) -> None:
        self._sessions.clear()


class HttpBackend:
    """The session API of a running server (``progpo webshop serve``); every call has a ``timeout_s`` deadline
    (wall clock: a server answering a byte at a time cannot hold the env)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        import os

        from progpo_envs.core.http_client import DeadlineSession
        from webshop_server.clients import CLIENT_TOKEN_VAR

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = DeadlineSession(timeout_s)
        if os.environ.get(CLIENT_TOKEN_VAR):  # the operator's token for this client (its own share)
            self._http.headers["Authorization"] = f"Bearer {os.environ[CLIENT_TOKEN_VAR]}"
        self._info = self._call("GET", "/api/info")

    def _call(self, method: str, path: str, **kwargs: Any) -> dict:
        import requests

        try:
            response = self._http.request(method, self.url + path, **kwargs)
        except requests.RequestException as exc:
            raise RuntimeError(f"WebShop server {self.url}: {method} {path} failed: {exc}") from exc
        if response.status_code >= 400:
            raise RuntimeError(
                f"WebShop server {method} {path} -> {response.status_code}: {response.text[:500]}"
            )
        return response.json() if response.content else {}

    @property
    def num_goals(self) -> int:
        return int(self._info["num_goals"])

    @property
    def fingerprint(self) -> str:
        return str(self._info["fingerprint"])

    def create(self, goal_index: int) -> tuple[str, str]:
        reply = self._call("POST", "/api/sessions", json={"goal_index": goal_index, "split": "all"})
        return reply["session_id"], reply["instruction"]

    def observe(self, sid: str, mode: ObservationMode) -> tuple[str, dict]:
        reply = self._call("GET", f"/api/sessions/{sid}/observation", params={"mode": mode.value})
        return reply["observation"], reply["available_actions"]

    def step(self, sid: str, action: str, mode: ObservationMode) -> dict:
        return self._call("POST", f"/api/sessions/{sid}/step", json={"action": action, "mode": mode.value})

    def expert_action(self, sid: str) -> str | None:
        return self._call("GET", f"/api/sessions/{sid}/expert_action")["action"]

    def close_session(self, sid: str) -> None:
        try:
            self._call("DELETE", f"/api/sessions/{sid}")
        except Exception:  # closing is best effort: the server expires idle sessions anyway
            pass

    def close(self) -> None:
        self._http.close()


def step_info(
    available: dict,
    *,
    valid: bool,
    score: float,
    done: bool,
    goal_index: int,
    expert_action: Callable[[], str] | None,
) -> dict[str, Any]:
    """The ``info`` of a WebShop step (shared by the in-process/HTTP env and the browser env).

    Args:
        available: The page's ``{has_search_bar, clickables}``.
        valid: Whether the action was a well-formed, available action.
        score: The raw 0–1 purchase score (0 until Buy Now).
        done: Whether the episode ended (a purchase).
        goal_index: The goal played.
        expert_action: Asks the expert for its next action (only when the env was made with ``expert=True``).
    """
    info = {
        "available_actions": available,
        "admissible_actions": admissible_actions(available),
        "action_valid": valid,
        "task_score": score,
        "won": bool(done and score == 1.0),
        "goal_index": goal_index,
    }
    if expert_action is not None:
        info["expert_action"] = None if done else expert_action()
    return info


class WebShopEnv(TextEnv):
    """WebShop goals as text episodes (see the module docstring).

    Args:
        split: ``"test"``, ``"train"`` or ``"all"`` (:class:`webshop_server.engine.Split`).
        num_products: Size of the generated catalog (default 1000), or how many products to read from
            ``data_dir`` (default all). Ignored with ``url``.
        seed: Catalog generation seed.
        data_dir: A directory with WebShop's raw files (real or generated) instead of the default catalog.
        human_goals: Human-style goals (upstream's standard) or synthetic ones.
        url: Base URL of a running server; ``None`` runs the engine in-process.
        engine: An engine to use in-process (overrides the catalog arguments; for tests and custom catalogs).
        observation_mode: ``text`` (default), ``text_rich``, ``html`` or ``url``.
        reward_mode: ``"success"`` (10 on a perfect purchase) or ``"raw"`` (the 0–1 score).
        success_reward: The reward of a perfect purchase in ``"success"`` mode.
        expert: Put the expert's next action in ``info["expert_action"]`` (the server must allow it for
        ``url``). max_steps: Actions per episode before truncation.
        history_depths, max_action_length, render_mode: See :class:`~progpo_envs.core.text_env.TextEnv`.
    """

    metadata = {
        **TextEnv.metadata,
        "prompt_style": "webshop",
        "agentgym_flavor": "webshop",
        "openenv_observation": "webshop",
    }

    @classmethod
    def split_names(cls, **_: Any) -> tuple[str, ...]:
        """``test``, ``train`` and ``all`` (:class:`webshop_server.engine.Split`), whatever the catalog."""
        return tuple(split.value for split in Split)

    def __init__(
        self,
        *,
        split: Split | str = Split.TRAIN,
        num_products: int | None = None,
        seed: int = 0,
        data_dir: str | Path | None = None,
        human_goals: bool = True,
        url: str | None = None,
        engine: WebShopEngine | None = None,
        observation_mode: ObservationMode | str = ObservationMode.TEXT,
        reward_mode: RewardMode | str = RewardMode.SUCCESS,
        success_reward: float = SUCCESS_REWARD,
        expert: bool = False,
        max_steps: int = DEFAULT_MAX_STEPS,
        history_depths: Sequence[int] = (),
        max_action_length: int = MAX_ACTION_LENGTH,
        render_mode: str | None = None,
    ):
        super().__init__(
            max_steps=max_steps,
            history_depths=history_depths,
            max_action_length=max_action_length,
            render_mode=render_mode,
        )
        self.split = Split(split)
        self.observation_mode = ObservationMode(observation_mode)
        self.reward_mode = RewardMode(reward_mode)
        self.success_reward = float(success_reward)
        self.expert = bool(expert)
        if url is not None:
            self._backend: LocalBackend | HttpBackend = HttpBackend(url)
        else:
            engine = engine or WebShopEngine.shared(
                num_products, seed, data_dir=data_dir, human_goals=human_goals
            )
            self._backend = LocalBackend(engine)
        self._goals = split_range(self.split, self._backend.num_goals)
        if len(self._goals) == 0:
            raise ValueError(
                f"split {self.split.value!r} is empty: the catalog has {self._backend.num_goals} goals"
            )
        self._fingerprint = self._backend.fingerprint
        self._sid: str | None = None
        self._goal_index = -1

    @property
    def num_tasks(self) -> int:
        """Goals in the selected split."""
        return len(self._goals)

    def goal_index(self, task_index: int) -> int:
        """The absolute goal index of the split's ``task_index``-th task."""
        return self._goals[task_index]

    def _start_task(self, task_index: int) -> TaskStart:
        if self._sid is not None:
            self._backend.close_session(self._sid)
        self._goal_index = self.goal_index(task_index)
        self._sid, _ = self._backend.create(self._goal_index)
        observation, available = self._backend.observe(self._sid, self.observation_mode)
        info = self._info(available, valid=True, score=0.0, done=False)
        return TaskStart(observation, f"webshop:{self._fingerprint}:{self._goal_index}", info)

    def _engine_step(self, action: str) -> EngineStep:
        result = self._backend.step(self._sid, action, self.observation_mode)
        score, done = float(result["score"]), bool(result["done"])
        if self.reward_mode is RewardMode.SUCCESS:
            reward = self.success_reward if done and score == 1.0 else 0.0
        else:
            reward = score if done else 0.0
        info = self._info(result["available_actions"], valid=bool(result["valid"]), score=score, done=done)
        return EngineStep(result["observation"], reward, done, info)

    def _invalid_action_step(self) -> EngineStep:
        observation, available = self._backend.observe(self._sid, self.observation_mode)
        return EngineStep(observation, 0.0, False, self._info(available, valid=False, score=0.0, done=False))

    def _info(self, available: dict, *, valid: bool, score: float, done: bool) -> dict[str, Any]:
        expert_action = (lambda: self._backend.expert_action(self._sid)) if self.expert else None
        return step_info(
            available,
            valid=valid,
            score=score,
            done=done,
            goal_index=self._goal_index,
            expert_action=expert_action,
        )

    def close(self) -> None:
        """Close the current session and the backend (safe to call twice)."""
        if self._sid is not None:
            self._backend.close_session(self._sid)
            self._sid = None
        self._backend.close()
        super().close()
