"""A scripted OpenAI-compatible model that answers with the expert's next command: a stand-in for a model when
testing a trainer's client (verifiers, SkyRL) or ``progpo eval --agent openai`` end to end on our envs.

Each client builds its own prompt, so an agent meant to play the same episodes through all of them must not
depend on the prompt's wording: this one does not. For each chat request it

1. finds the episode the conversation plays: among the run's episodes (task index, seed, split; fixed when it
   starts), the one whose task sentence and first observation (as our prompt styles clean them) both appear
   in the conversation's user and system messages (refused, 400, unless exactly one does; the episodes are
   checked to be told apart at start);
2. reads the commands played so far from the assistant messages (the ``<action>...</action>`` of each: its
   own earlier answers, whatever history the client keeps);
3. plays them again in its own copy of the env, made with the expert on, in this process, and answers
   ``<think>...</think><action>{the expert's next command}</action>``.

It never reads the expert from what a policy is shown (no prompt carries it); it reads it from its own env,
the way ``progpo eval --agent expert`` does in process. Its copies are kept per episode and replayed from
the start only when a conversation is not an extension of the last one played.
``benchmarks/bench_integrations.py`` plays every client against it (docs/hosting.md, "Trainers").

Routes: ``POST /v1/chat/completions`` (``stream`` true or false), ``GET /v1/models``, ``GET /health``;
:class:`StandInServer` serves them on a free loopback port.

Example:
    >>> stand_in = ExpertStandIn("progpo/ALFWorld-v0", [EpisodeSpec(task_index=0, seed=0, split="train")])
    >>> env = gym.make("progpo/ALFWorld-v0", split="train")
    >>> observation, _ = env.reset(seed=0, options={"task_index": 0})
    >>> stand_in.answer([{"role": "user", "content": observation}])
    "<think>The expert's next command.</think><action>go to drawer 1</action>"
    >>> stand_in.close(), env.close()
    (None, None)
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
from flask import Flask, Response, jsonify, request

import progpo_envs  # noqa: F401  (registers the ids)
from agents.prompts import get_style, style_name_from_metadata, task_text_from_observation
from progpo_envs.server.serving import BackgroundServer

#: The model name the stand-in serves (any name is answered).
MODEL_NAME = "expert-stand-in"
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode of a run: task ``task_index`` of ``split``, reset with ``seed``."""

    task_index: int
    seed: int
    split: str


class UnknownConversation(ValueError):
    """A chat request that plays none of the run's episodes, or several (answered 400)."""


#: One env step at a time in this process: the engines' copies of ALFWorld's planner are not thread-safe,
#: and the server answers each request on its own thread.
_ENGINE_LOCK = threading.Lock()


class _Replay:
    """One episode's env with the expert on, and the commands played on it since its reset."""

    def __init__(self, env: gym.Env, spec: EpisodeSpec):
        self.env, self.spec = env, spec
        self.played: list[str] = []
        self.info: dict[str, Any] = {}
        self.done = False

    def reset(self) -> tuple[str, dict[str, Any]]:
        observation, self.info = self.env.reset(
            seed=self.spec.seed, options={"task_index": self.spec.task_index}
        )
        self.played, self.done = [], False
        return observation, self.info

    def expert_after(self, actions: Sequence[str]) -> str | None:
        """The expert's next command once ``actions`` are played from the start (``None`` when it has none or
        the episode ended)."""
        with _ENGINE_LOCK:
            if list(actions[: len(self.played)]) != self.played:
                self.reset()
            for action in actions[len(self.played) :]:
                if self.done:
                    break
                _, _, terminated, truncated, self.info = self.env.step(action)
                self.played.append(action)
                self.done = bool(terminated or truncated)
            return None if self.done else self.info.get("expert_action")


def _normalize(text: str) -> str:
    return " ".join(text.split())


class ExpertStandIn:
    """The stand-in's episodes and its answers (see the module docstring).

    Args:
        env_id: The env played.
        episodes: The run's episodes.
        env_kwargs: The env's constructor kwargs (the server's, e.g. ``num_products``), without ``split``.
    """

    def __init__(
        self, env_id: str, episodes: Sequence[EpisodeSpec], env_kwargs: Mapping[str, Any] | None = None
    ):
        self.env_id = env_id
        self.replays: list[_Replay] = []
        self.keys: list[tuple[str, str]] = []
        self.requests = 0
        for spec in episodes:
            env = gym.make(env_id, **{**dict(env_kwargs or {}), "split": spec.split, "expert": True})
            replay = _Replay(env, spec)
            with _ENGINE_LOCK:
                observation, info = replay.reset()
            style = get_style(style_name_from_metadata(env.unwrapped.metadata))
            task = task_text_from_observation(style.name, observation, info)
            self.keys.append((_normalize(task), _normalize(style.clean_observation(observation, task))))
            self.replays.append(replay)
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(
                "two of the episodes start alike: the stand-in could not tell their prompts apart"
            )

    def close(self) -> None:
        for replay in self.replays:
            replay.env.close()

    def episode_of(self, messages: Sequence[Mapping[str, Any]]) -> _Replay:
        """The episode a conversation plays (:class:`UnknownConversation` unless exactly one matches)."""
        shown = _normalize(
            "\n".join(_content(m) for m in messages if m.get("role") in ("system", "user", "tool"))
        )
        found = [
            r
            for r, (task, first) in zip(self.replays, self.keys, strict=True)
            if task in shown and first in shown
        ]
        if len(found) != 1:
            raise UnknownConversation(
                f"the conversation matches {len(found)} of the run's {len(self.replays)} episodes"
            )
        return found[0]

    def answer(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The reply to one chat request: the expert's next command, in ``<action>`` tags."""
        replay = self.episode_of(messages)
        actions = []
        for message in messages:
            if message.get("role") == "assistant":
                found = _ACTION.findall(_content(message))
                actions.append(_normalize(found[0]) if found else _normalize(_content(message)))
        command = replay.expert_after(actions) or "look"
        self.requests += 1
        return f"<think>The expert's next command.</think><action>{command}</action>"


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def create_app(stand_in: ExpertStandIn) -> Flask:
    """The OpenAI-compatible routes on ``stand_in``."""
    app = Flask(__name__)

    @app.get("/health")
    def health():
        return jsonify(status="ok")

    @app.get("/v1/models")
    def models():
        return jsonify(object="list", data=[{"id": MODEL_NAME, "object": "model", "owned_by": "progpo"}])

    @app.post("/v1/chat/completions")
    def chat():
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return jsonify(error={"message": "the body must be a JSON object with a messages list"}), 400
        try:
            text = stand_in.answer(body["messages"])
        except UnknownConversation as exc:
            return jsonify(error={"message": str(exc)}), 400
        model = str(body.get("model") or MODEL_NAME)
        created, ident = int(time.time()), f"chatcmpl-{stand_in.requests}"
        usage = {
            "prompt_tokens": 0,
            "completion_tokens": len(text.split()),
            "total_tokens": len(text.split()),
        }
        if not body.get("stream"):
            return jsonify(
                id=ident,
                object="chat.completion",
                created=created,
                model=model,
                choices=[
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                usage=usage,
            )
        chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
        events = [
            {
                **chunk,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
                ],
            },
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**chunk, "choices": [], "usage": usage},
        ]
        stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        return Response(stream, mimetype="text/event-stream")

    return app


class StandInServer(BackgroundServer):
    """The stand-in served on a free loopback port on a thread (``url``: its base, ``.../v1`` for clients)."""

    def __init__(self, stand_in: ExpertStandIn):
        super().__init__(create_app(stand_in), shutdown_pool=False)
        self.stand_in = stand_in
