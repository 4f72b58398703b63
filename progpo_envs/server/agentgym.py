"""AgentGym's env-server protocol on the env pool: agents written for AgentGym servers work unchanged.

AgentGym (WooooDyy/AgentGym, ``agentenv-alfworld`` and ``agentenv-webshop``) serves one env type per process
with integer env ids and these routes; we answer the same paths and payloads (restated from its servers and
clients, ``agentenv/envs/{alfworld,webshop}.py``):

Which one an env gets is its own statement: ``metadata["agentgym_flavor"]`` (WebShop's env says ``"webshop"``;
an env that says nothing gets ALFWorld's shape).

ALFWorld flavour (``progpo/ALFWorld-v0``, and any other hosted env)
    ``GET /`` → a greeting; ``POST /create`` → ``{"id": int}``;
    ``POST /reset {id, game, world_type="Text"}`` → ``{id, observation, available_actions, task_type}``;
    ``POST /step {id, action}`` → ``{observation, reward, available_actions, done}``;
    ``GET /observation?id=`` → text; ``GET /available_actions?id=`` → list; ``GET /detail?id=`` → the last
    state; ``POST /close {id}``.

WebShop flavour (``progpo/WebShop-v0``)
    ``GET /`` → ``"ok"``; ``POST /create`` → int;
    ``POST /reset {env_idx, session_id?}`` → ``[observation, null]``; ``POST /step {env_idx, action}`` →
    ``{state, reward, done, info: null}``; ``GET /observation?env_idx=`` → text;
    ``GET /available_actions?env_idx=`` → ``{has_search_bar, clickables}``; ``GET /instruction_text?env_idx=``
    → text; ``GET /state?env_idx=`` → ``{url, html, instruction_text}``; ``POST /close {env_idx}``.

AgentGym's semantics, whatever RL settings (``success_reward``, ``reward_mode``, ``split``) the operator gave
the env for its native API, because AgentGym's ``Evaluator`` counts an episode as a success when its last
reward is 1 (or 100) and reports the mean reward as the score:

* ALFWorld: the reward is ``float(won)``; the first observation has TextWorld's ``-= Welcome to TextWorld,
  ALFRED! =-`` banner dropped and its paragraphs joined by single newlines, and a step observation starting
  with the stock engine's ``You arrive at loc N.`` loses that sentence, as AgentGym's server does;
  ``task_type`` is ``<task folder>/<trial>`` (AgentGym's form, the env's ``task_id``). ``game`` N indexes the
  hosted split; with :class:`AgentGymGames` (``progpo serve --agentgym-mappings DIR``) it is exactly
  AgentGym's game N: entry N of ``mappings_train.json`` (trials of ``json_2.1.1/train``) followed by
  ``mappings_test.json`` (``json_2.1.1/valid_train``, ids 2420-2619).
* WebShop: ``session_id`` is the absolute goal number, test goals first (0-499 on a full-size catalog), as in
  WebShop's ``fixed_<n>`` sessions; the reward is the raw 0-1 purchase score, given on Buy Now, and ``done``
  comes with the purchase (the step limit is raised to :data:`WEBSHOP_MAX_STEPS`: AgentGym's client caps the
  rounds itself).

Differences, on purpose: ids are random 53-bit integers (not 0, 1, 2, ...), so one client cannot address
another's env; errors are 4xx answers with ``{"error": message}`` (AgentGym answers errors with HTTP 200);
there is no ``/list_envs`` (it would reveal every client's ids); stepping a finished episode returns its final
state again (the text env's latch) instead of an error; ``world_type`` must be ``"Text"``; ALFWorld's
``available_actions`` leave out ``help``, as the env's ``admissible_actions`` do; instances expire when idle
(unless the server runs with ``--idle-timeout 0``) and count against the server's instance limit like any
other; the WebShop ``state`` route has ``url`` and ``html`` only if the env's info carries them (``null``
otherwise).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
from flask import Blueprint, jsonify, request

from progpo_envs.alfworld.data import available_splits, load_tasks, resolve_data_dir
from progpo_envs.core.registration import env_statements
from progpo_envs.server.codec import decode
from progpo_envs.server.pool import EnvPool, ServerError
from progpo_envs.server.request_args import available_actions, json_body, request_client

_ID_BITS = 53  # exact in every JSON implementation (IEEE doubles)
#: AgentGym's ALFWorld mapping files, in id order, and the ``json_2.1.1`` split each one's trials come from.
MAPPING_FILES = (("mappings_train.json", "train"), ("mappings_test.json", "valid_train"))
#: Step limit of a WebShop instance behind AgentGym's routes: its episodes end at the purchase (AgentGym's
#: WebShop has no step limit; its client stops after ``max_rounds``), this only bounds an abandoned one.
WEBSHOP_MAX_STEPS = 1000
_BANNER = ("-=", "=-")  # TextWorld's welcome line: ``-= Welcome to TextWorld, ALFRED! =-``
_ARRIVAL = "You arrive at loc "


class Flavor(str, enum.Enum):
    """Which AgentGym server's payloads to speak."""

    ALFWORLD = "alfworld"
    WEBSHOP = "webshop"


def flavor_of(env_id: str) -> Flavor:
    """The AgentGym flavour a registered env states (``metadata["agentgym_flavor"]``; ALFWorld's shape for an
    env that states none)."""
    return Flavor(env_statements(gym.spec(env_id).entry_point).get("agentgym_flavor", Flavor.ALFWORLD.value))


def alfworld_observation(observation: str) -> str:
    """An observation as AgentGym's ALFWorld server sends it.

    On reset AgentGym keeps what follows the first blank line (TextWorld's banner, ``-= Welcome to TextWorld,
    ALFRED! =-``) and joins the paragraphs with single newlines; on a step it drops a leading ``You arrive at
    loc N.`` (the stock engine's location number). Only a TextWorld banner is dropped here, so envs without
    one keep their text.

    Example:
        >>> alfworld_observation("-= Welcome to TextWorld, ALFRED! =-\\n\\nIn a room.\\n\\nYour task: x.")
        'In a room.\\nYour task: x.'
        >>> alfworld_observation("You arrive at loc 12. On the desk 1, you see a pen 1.")
        'On the desk 1, you see a pen 1.'
        >>> alfworld_observation("Find the key.")
        'Find the key.'
    """
    banner, _, rest = observation.partition("\n\n")
    if banner.startswith(_BANNER[0]) and banner.rstrip().endswith(_BANNER[1]):
        return "\n".join(rest.split("\n\n"))
    if observation.startswith(_ARRIVAL) and ". " in observation:
        return observation[observation.index(". ") + 2 :]
    return observation


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


@dataclasses.dataclass(frozen=True)
class AgentGymGame:
    """One of AgentGym's ALFWorld games: its id, the ``json_2.1.1`` split and ``<task folder>/<trial>``."""

    game: int
    split: str
    task_id: str


class AgentGymGames:
    """AgentGym's ALFWorld game ids over real ALFWorld data (``progpo serve --agentgym-mappings DIR``).

    AgentGym's server lists ``mappings_train.json`` then ``mappings_test.json`` (each a JSON list of
    ``{item_id, task_type, task_id}``, ``task_type`` being the ALFRED task folder) and loads game N from entry
    N's ``json_2.1.1/<split>/<task_type>/<task_id>/``. A trial missing from ``data_dir`` (or not playable by
    ALFWorld's selection rules) is answered with a 404 naming it.

    Args:
        folder: The folder holding AgentGym's two mapping files (its ``agentenv-alfworld/configs``).
        data_dir: The folder that contains ``json_2.1.1/`` (real data).

    Raises:
        FileNotFoundError: A mapping file is missing, or ``data_dir`` holds none of the mapped splits.
        ValueError: A mapping file is not AgentGym's format (ids must run 0, 1, 2, ... across both files).

    Example:
        >>> games = AgentGymGames("AgentGym/agentenv-alfworld/configs", "/data/alfworld")  # doctest: +SKIP
        >>> games[2420]  # doctest: +SKIP
        AgentGymGame(game=2420, split='valid_train', task_id='pick_cool_then_place_in_recep-Mug-None-...')
    """

    def __init__(self, folder: str | Path, data_dir: str | Path):
        self.folder, self.data_dir = Path(folder), Path(data_dir)
        self.games: list[AgentGymGame] = []
        for name, split in MAPPING_FILES:
            path = self.folder / name
            if not path.is_file():
                raise FileNotFoundError(f"no AgentGym mapping file {path} (the folder needs {_file_names()})")
            try:
                entries = json.loads(path.read_text())
                for entry in entries:
                    if int(entry["item_id"]) != len(self.games):
                        raise ValueError(f"item_id {entry['item_id']} where {len(self.games)} was expected")
                    task_id = f"{entry['task_type']}/{entry['task_id']}"
                    self.games.append(AgentGymGame(len(self.games), split, task_id))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path} is not an AgentGym mapping file ({exc})") from None
        present = set(available_splits(self.data_dir))
        self.splits = [split for _, split in MAPPING_FILES if split in present]
        if not self.splits:
            raise FileNotFoundError(
                f"{self.data_dir}/json_2.1.1 has none of AgentGym's splits {[s for _, s in MAPPING_FILES]}"
            )
        self._task_indices: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_env(cls, folder: str | Path, fixed_kwargs: Mapping[str, Any]) -> AgentGymGames:
        """The games for an ALFWorld env hosted with ``fixed_kwargs`` (data: its ``data_dir`` or env var)."""
        data_dir = resolve_data_dir(fixed_kwargs.get("data_dir"))
        if data_dir is None:
            raise FileNotFoundError(
                "AgentGym's mappings name real ALFWorld trials: set ALFWORLD_DATA (or data_dir in "
                "--env-kwargs) to the folder that contains json_2.1.1/"
            )
        return cls(folder, data_dir)

    def __len__(self) -> int:
        return len(self.games)

    def __getitem__(self, game: int) -> AgentGymGame:
        return self.games[game]

    @property
    def default_split(self) -> str:
        """The split a new instance starts with: AgentGym's test split when the data has it."""
        return self.splits[-1]

    def task_index(self, game: AgentGymGame) -> int:
        """The position of ``game``'s trial in its split as the env loads it (404 if absent)."""
        trial = f"json_2.1.1/{game.split}/{game.task_id}"
        if not (self.data_dir / trial / "traj_data.json").is_file():
            raise ServerError(404, f"game {game.game} is AgentGym's trial {trial}, not in {self.data_dir}")
        with self._lock:
            indices = self._task_indices.get(game.split)
            if indices is None:
                tasks = load_tasks(game.split, self.data_dir)
                indices = self._task_indices[game.split] = {t.task_id: i for i, t in enumerate(tasks)}
        if game.task_id not in indices:
            raise ServerError(
                404, f"game {game.game} is AgentGym's trial {trial}, which ALFWorld's rules leave out"
            )
        return indices[game.task_id]


def _file_names() -> str:
    return " and ".join(name for name, _ in MAPPING_FILES)


@dataclasses.dataclass
class _Entry:
    """What one AgentGym id stands for: a pool instance, its split (ALFWorld with mappings) and last game."""

    instance_id: str
    split: str | None = None
    game: int | None = None


class _IdMap:
    """AgentGym's integer ids → pool instances."""

    def __init__(self, pool: EnvPool):
        self.pool = pool
        self._ids: dict[int, _Entry] = {}
        self._lock = threading.Lock()

    def add(self, entry: _Entry) -> int:
        with self._lock:
            if len(self._ids) > 2 * self.pool.config.max_instances:  # forget instances that expired meanwhile
                self._ids = {k: v for k, v in self._ids.items() if self.pool.has(v.instance_id)}
            while True:
                env_id = secrets.randbits(_ID_BITS)
                if env_id not in self._ids:
                    self._ids[env_id] = entry
                    return env_id

    def get(self, raw: Any) -> _Entry:
        if isinstance(raw, bool):
            raw = None
        try:
            env_id = int(raw)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(Infinity)
            raise ServerError(400, "missing or malformed env id (an integer)") from None
        with self._lock:
            entry = self._ids.get(env_id)
        if entry is None:
            raise ServerError(404, f"the id {env_id} is not valid (closed, expired or never created)")
        return entry

    def remove(self, raw: Any) -> _Entry:
        entry = self.get(raw)
        with self._lock:
            self._ids = {k: v for k, v in self._ids.items() if v is not entry}
        return entry


def agentgym_blueprint(pool: EnvPool, env_id: str, games: AgentGymGames | None = None) -> Blueprint:
    """Routes of AgentGym's protocol for ``env_id`` (a hosted env), mounted at the server's root.

    Args:
        pool: The server's env pool.
        env_id: The hosted env served through AgentGym's protocol.
        games: AgentGym's ALFWorld game ids (ALFWorld flavour only); ``None``: ``game`` indexes the hosted
            split.
    """
    if env_id not in pool.policies:
        raise ValueError(f"{env_id!r} is not hosted by this server")
    flavor = flavor_of(env_id)
    if games is not None and flavor is not Flavor.ALFWORLD:
        raise ValueError("AgentGym's game mappings are ALFWorld's; the AgentGym env here is WebShop")
    id_key = "env_idx" if flavor is Flavor.WEBSHOP else "id"
    ids = _IdMap(pool)
    blueprint = Blueprint("agentgym", __name__)

    def server_kwargs(split: str | None) -> dict[str, Any]:
        if flavor is Flavor.WEBSHOP:
            return {"split": "all", "max_steps": WEBSHOP_MAX_STEPS}
        if split is None:
            return {}
        return {"split": split, "task_types": None, "scenes": None}  # the whole split, as AgentGym's ids

    def new_entry(split: str | None) -> _Entry:
        instance_id, _ = pool.create(env_id, {}, server_kwargs(split), client=request_client())
        return _Entry(instance_id, split)

    def last(entry: _Entry) -> tuple[str, dict[str, Any]]:
        state = pool.call(entry.instance_id, "get", {})
        return state["observation"], decode(state["info"])

    def query_entry() -> _Entry:
        return ids.get(request.args.get(id_key))

    def reset_to(entry: _Entry, task_index: Any) -> tuple[str, dict[str, Any]]:
        if task_index is not None and (isinstance(task_index, bool) or not isinstance(task_index, int)):
            raise ServerError(400, "the task index must be an integer")
        options = {"task_index": task_index} if task_index is not None else None
        answer = pool.call(entry.instance_id, "reset", {"seed": None, "options": options})
        return answer["observation"], decode(answer["info"])

    def step(body: dict) -> tuple[str, bool, dict[str, Any]]:
        entry = ids.get(body.get(id_key))
        action = body.get("action")
        if not isinstance(action, str):
            raise ServerError(400, "action must be a string")
        answer = pool.call(entry.instance_id, "step", {"action": action, "seq": None})
        done = bool(answer["terminated"] or answer["truncated"])
        return answer["observation"], done, decode(answer["info"])

    @blueprint.post("/create")
    def create():
        agentgym_id = ids.add(new_entry(games.default_split if games is not None else None))
        return jsonify(agentgym_id if flavor is Flavor.WEBSHOP else {"id": agentgym_id})

    @blueprint.post("/close")
    def close():
        pool.close_instance(ids.remove(json_body().get(id_key)).instance_id)
        return jsonify(closed=True)

    @blueprint.get("/observation")
    def observation():
        text = last(query_entry())[0]
        return jsonify(text if flavor is Flavor.WEBSHOP else alfworld_observation(text))

    if flavor is Flavor.WEBSHOP:

        @blueprint.get("/")
        def hello():
            return jsonify("ok")

        @blueprint.post("/reset")
        def reset():
            body = json_body()
            observation, _ = reset_to(ids.get(body.get(id_key)), body.get("session_id"))
            return jsonify([observation, None])

        @blueprint.post("/step")
        def webshop_step():
            observation, done, info = step(json_body())
            score = float(info.get("task_score", 0.0)) if done else 0.0  # the raw score, at the purchase
            return jsonify(state=observation, reward=score, done=done, info=None)

        @blueprint.get("/available_actions")
        def webshop_actions():
            available = last(query_entry())[1].get("available_actions")
            if not isinstance(available, dict):
                available = {"has_search_bar": False, "clickables": []}
            return jsonify(
                has_search_bar=bool(available.get("has_search_bar")),
                clickables=list(available.get("clickables", [])),
            )

        @blueprint.get("/instruction_text")
        def webshop_instruction():
            return jsonify(instruction_text(*last(query_entry())))

        @blueprint.get("/state")
        def webshop_state():
            observation, info = last(query_entry())
            return jsonify(
                url=info.get("url"),
                html=info.get("html"),
                instruction_text=instruction_text(observation, info),
            )

    else:

        @blueprint.get("/")
        def hello():
            return jsonify("This is environment AlfWorld.")

        def task_index_of(entry: _Entry, game: Any) -> Any:
            """The task index of AgentGym's ``game`` (moving the instance to the game's split if needed)."""
            if games is None or game is None or isinstance(game, bool) or not isinstance(game, int):
                return game  # without mappings the game indexes the hosted split; reset_to checks the type
            if not 0 <= game < len(games):
                raise ServerError(400, f"game must be one of AgentGym's ids 0..{len(games) - 1}, got {game}")
            target = games[game]
            task_index = games.task_index(target)
            if entry.split != target.split:
                replacement = new_entry(target.split)
                old_instance = entry.instance_id
                entry.instance_id, entry.split = replacement.instance_id, replacement.split
                pool.close_instance(old_instance)
            return task_index

        @blueprint.post("/reset")
        def reset():
            body = json_body()
            world_type = body.get("world_type", "Text")
            if world_type != "Text":
                raise ServerError(
                    400, 'world_type must be "Text" (the embodied THOR worlds are not hosted here)'
                )
            entry = ids.get(body.get(id_key))
            game = body.get("game")
            observation, info = reset_to(entry, task_index_of(entry, game))
            entry.game = game
            return jsonify(
                id=body.get(id_key),
                observation=alfworld_observation(observation),
                available_actions=available_actions(info) or [],
                task_type=info.get("task_id"),
            )

        @blueprint.post("/step")
        def alfworld_step():
            observation, done, info = step(json_body())
            return jsonify(
                observation=alfworld_observation(observation),
                reward=float(bool(info.get("won", False))),
                available_actions=available_actions(info) or [],
                done=done,
            )

        @blueprint.get("/available_actions")
        def alfworld_actions():
            return jsonify(available_actions(last(query_entry())[1]) or [])

        @blueprint.get("/detail")
        def detail():
            entry = query_entry()
            observation, info = last(entry)
            won = bool(info.get("won", False))
            return jsonify(
                game=entry.game,
                observation=alfworld_observation(observation),
                available_actions=available_actions(info) or [],
                task_type=info.get("task_id"),
                task_index=info.get("task_index"),
                won=won,
                reward=float(won),
            )

    return blueprint
