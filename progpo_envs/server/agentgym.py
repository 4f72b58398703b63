"""AgentGym's env-server protocol on the env pool: agents written for AgentGym servers work unchanged.

AgentGym (WooooDyy/AgentGym, ``agentenv-alfworld`` and ``agentenv-webshop``) serves one env type per process
with integer env ids and these routes; we answer the same paths and payloads (restated from its servers and
clients, ``agentenv/envs/{alfworld,webshop}.py``):

ALFWorld flavour (``progpo/ALFWorld-v0``, and any other hosted env)
    ``GET /`` → a greeting; ``POST /create`` → ``{"id": int}``;
    ``POST /reset {id, game, world_type="Text"}`` → ``{id, observation, available_actions, task_type}``
    (``game`` is the task index); ``POST /step {id, action}`` → ``{observation, reward, available_actions,
    done}``; ``GET /observation?id=`` → text; ``GET /available_actions?id=`` → list; ``GET /detail?id=`` → the
    last state; ``POST /close {id}``.

WebShop flavour (``progpo/WebShop-v0``)
    ``GET /`` → ``"ok"``; ``POST /create`` → int;
    ``POST /reset {env_idx, session_id?}`` → ``[observation, null]``
    (``session_id`` is the task index); ``POST /step {env_idx, action}`` → ``{state, reward, done, info:
    null}``; ``GET /observation?env_idx=`` → text; ``GET /available_actions?env_idx=`` → ``{has_search_bar,
    clickables}``; ``GET /instruction_text?env_idx=`` → text; ``GET /state?env_idx=`` → ``{url, html,
    instruction_text}``; ``POST /close {env_idx}``.

Differences, on purpose: ids are random 53-bit integers (not 0, 1, 2, ...), so one client cannot address
another's env; errors are 4xx answers with ``{"error": message}`` (AgentGym answers errors with HTTP 200);
there is no ``/list_envs`` (it would reveal every client's ids); stepping a finished episode returns its final
state again (the text env's latch) instead of an error; ``world_type`` must be ``"Text"``; instances expire
when idle and count against the server's instance limit like any other; the WebShop ``state`` route has
``url`` and ``html`` only if the env's info carries them (``null`` otherwise).
"""

from __future__ import annotations

import enum
import secrets
import threading
from typing import Any

from flask import Blueprint, jsonify, request

from progpo_envs.server.app import available_actions, json_body
from progpo_envs.server.codec import decode
from progpo_envs.server.pool import EnvPool, ServerError

_ID_BITS = 53  # exact in every JSON implementation (IEEE doubles)


class Flavor(str, enum.Enum):
    """Which AgentGym server's payloads to speak."""

    ALFWORLD = "alfworld"
    WEBSHOP = "webshop"


def flavor_of(env_id: str) -> Flavor:
    """The AgentGym flavour of a hosted env id (WebShop's for WebShop, ALFWorld's shape for any other)."""
    return Flavor.WEBSHOP if "webshop" in env_id.lower() else Flavor.ALFWORLD


def instruction_text(observation: str, info: dict[str, Any]) -> str:
    """The shopping instruction: ``info["instruction"]`` if present, else the text after ``Instruction:``."""
    if isinstance(info.get("instruction"), str):
        return info["instruction"]
    parts = [part.strip() for part in observation.split("[SEP]")]
    for position, part in enumerate(parts):
        if part.startswith("Instruction:"):
            rest = part[len("Instruction:") :].strip()
            return rest or (parts[position + 1] if position + 1 < len(parts) else "")
    return ""


class _IdMap:
    """AgentGym's integer ids → pool instance ids."""

    def __init__(self, pool: EnvPool):
        self.pool = pool
        self._ids: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, instance_id: str) -> int:
        with self._lock:
            if len(self._ids) > 2 * self.pool.config.max_instances:  # forget instances that expired meanwhile
                self._ids = {k: v for k, v in self._ids.items() if self.pool.has(v)}
            while True:
                env_id = secrets.randbits(_ID_BITS)
                if env_id not in self._ids:
                    self._ids[env_id] = instance_id
                    return env_id

    def get(self, raw: Any) -> str:
        if isinstance(raw, bool):
            raw = None
        try:
            env_id = int(raw)
        except (TypeError, ValueError):
            raise ServerError(400, "missing or malformed env id (an integer)") from None
        with self._lock:
            instance_id = self._ids.get(env_id)
        if instance_id is None:
            raise ServerError(404, f"the id {env_id} is not valid (closed, expired or never created)")
        return instance_id

    def remove(self, raw: Any) -> str:
        instance_id = self.get(raw)
        with self._lock:
            self._ids = {k: v for k, v in self._ids.items() if v != instance_id}
        return instance_id


def agentgym_blueprint(pool: EnvPool, env_id: str) -> Blueprint:
    """Routes of AgentGym's protocol for ``env_id`` (a hosted env), mounted at the server's root."""
    if env_id not in pool.policies:
        raise ValueError(f"{env_id!r} is not hosted by this server")
    flavor = flavor_of(env_id)
    id_key = "env_idx" if flavor is Flavor.WEBSHOP else "id"
    ids = _IdMap(pool)
    blueprint = Blueprint("agentgym", __name__)

    def last(instance_id: str) -> tuple[str, dict[str, Any]]:
        state = pool.call(instance_id, "get", {})
        return state["observation"], decode(state["info"])

    def body_id(body: dict) -> str:
        return ids.get(body.get(id_key))

    def query_id() -> str:
        return ids.get(request.args.get(id_key))

    def reset_to(instance_id: str, task_index: Any) -> tuple[str, dict[str, Any]]:
        if task_index is not None and (isinstance(task_index, bool) or not isinstance(task_index, int)):
            raise ServerError(400, "the task index must be an integer")
        options = {"task_index": task_index} if task_index is not None else None
        answer = pool.call(instance_id, "reset", {"seed": None, "options": options})
        return answer["observation"], decode(answer["info"])

    def step(body: dict) -> tuple[str, float, bool, dict[str, Any]]:
        instance_id = body_id(body)
        action = body.get("action")
        if not isinstance(action, str):
            raise ServerError(400, "action must be a string")
        answer = pool.call(instance_id, "step", {"action": action, "seq": None})
        done = bool(answer["terminated"] or answer["truncated"])
        return answer["observation"], float(decode(answer["reward"])), done, decode(answer["info"])

    @blueprint.post("/create")
    def create():
        instance_id, _ = pool.create(env_id, {})
        agentgym_id = ids.add(instance_id)
        return jsonify(agentgym_id if flavor is Flavor.WEBSHOP else {"id": agentgym_id})

    @blueprint.post("/close")
    def close():
        pool.close_instance(ids.remove(json_body().get(id_key)))
        return jsonify(closed=True)

    @blueprint.get("/observation")
    def observation():
        return jsonify(last(query_id())[0])

    if flavor is Flavor.WEBSHOP:

        @blueprint.get("/")
        def hello():
            return jsonify("ok")

        @blueprint.post("/reset")
        def reset():
            body = json_body()
            observation, _ = reset_to(body_id(body), body.get("session_id"))
            return jsonify([observation, None])

        @blueprint.post("/step")
        def webshop_step():
            observation, reward, done, _ = step(json_body())
            return jsonify(state=observation, reward=reward, done=done, info=None)

        @blueprint.get("/available_actions")
        def webshop_actions():
            available = last(query_id())[1].get("available_actions")
            if not isinstance(available, dict):
                available = {"has_search_bar": False, "clickables": []}
            return jsonify(
                has_search_bar=bool(available.get("has_search_bar")),
                clickables=list(available.get("clickables", [])),
            )

        @blueprint.get("/instruction_text")
        def webshop_instruction():
            return jsonify(instruction_text(*last(query_id())))

        @blueprint.get("/state")
        def webshop_state():
            observation, info = last(query_id())
            return jsonify(
                url=info.get("url"),
                html=info.get("html"),
                instruction_text=instruction_text(observation, info),
            )

    else:

        @blueprint.get("/")
        def hello():
            return jsonify("This is environment AlfWorld.")

        @blueprint.post("/reset")
        def reset():
            body = json_body()
            world_type = body.get("world_type", "Text")
            if world_type != "Text":
                raise ServerError(
                    400, 'world_type must be "Text" (the embodied THOR worlds are not hosted here)'
                )
            instance_id = body_id(body)
            observation, info = reset_to(instance_id, body.get("game"))
            return jsonify(
                id=body.get(id_key),
                observation=observation,
                available_actions=available_actions(info) or [],
                task_type=info.get("task_type"),
            )

        @blueprint.post("/step")
        def alfworld_step():
            body = json_body()
            observation, reward, done, info = step(body)
            return jsonify(
                observation=observation,
                reward=reward,
                available_actions=available_actions(info) or [],
                done=done,
            )

        @blueprint.get("/available_actions")
        def alfworld_actions():
            return jsonify(available_actions(last(query_id())[1]) or [])

        @blueprint.get("/detail")
        def detail():
            observation, info = last(query_id())
            return jsonify(
                observation=observation,
                available_actions=available_actions(info) or [],
                task_type=info.get("task_type"),
                task_index=info.get("task_index"),
                won=bool(info.get("won", False)),
            )

    return blueprint
