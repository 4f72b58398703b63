"""Seeded ALFWorld task generator: new games for all six task types, in ALFWorld's own data layout.

``alfworld-download`` fetches ALFWorld's games from GitHub, which an offline machine cannot do. The
``alfworld`` wheel does ship everything a game is made of, though: the PDDL domain and TextWorld grammar
(``alfworld/data``), the 120 AI2-THOR scene layouts (``alfworld/gen/layouts``: which object classes a scene
has and where its receptacles stand), the physics tables (``alfworld/gen/constants.py``: what each receptacle
can hold, what can be heated, cooled, cleaned, toggled) and the goals with their language templates
(``alfworld/gen/goal_library.py``). This module turns those into new games:

1. **Scene.** A FloorPlan of the split whose room type ALFRED allows for the task (``GOALS_VALID``) and that
   has the appliance the task needs (sink basin, microwave, fridge, desk lamp). Its receptacles are the
   instances listed in ``FloorPlan*-openable.json`` (with their agent poses, which become locations;
   ``Sink``/``Bathtub`` become their ``SinkBasin``/``BathtubBasin``, named as ALFRED names them) plus one
   instance of every other static receptacle class in ``FloorPlan*-objects.json``.
2. **Task.** A target class from the scene's pickable objects that the task accepts (e.g. ``Heatable``) and a
   goal receptacle class that can contain it (``VAL_RECEPTACLE_OBJECTS``), or a desk lamp for
   look-at-in-light.
3. **Placement.** 1–3 targets (2–4 for pick two) and 8–15 distractors, each in a receptacle that can contain
   it, never a target in a goal-class receptacle (the goal must not hold at the start).
4. **Files.** ``initial_state.pddl`` in the form of ALFRED's (mangled THOR-style ids, ``receptacleType``,
   ``objectType``, ``canContain``, ``inReceptacle``, ``receptacleAtLocation`` ... and the goal of ``gdict``),
   ``traj_data.json`` with ``task_type`` and ``pddl_params`` (what ALFWorld's loaders and experts read), and
   ``game.tw-pddl`` = domain + grammar with the task text (a ``gdict`` template drawn with the game's seeded
   generator, as :func:`progpo_envs.alfworld.wheel.templated_task_description` does) + problem +
   ``solvable`` + ``walkthrough``.
5. **Verification.** The walkthrough is the expert's plan (:mod:`progpo_envs.alfworld.expert`) on the
   generator's own state, named as ALFWorld's ``Demangler`` names the ids. It is replayed in the real
   TextWorld ``PddlEnv``: every command must be admissible and the game must be won exactly at its last
   command. A game that fails is drawn again.

Splits follow ALFWorld's seen/unseen idea: ``train`` and ``valid_seen`` use ALFRED's training scenes, except
the four scenes of ALFWorld's ``valid_unseen`` (10, 219, 308, 424), which ``valid_unseen`` uses alone. Each
game is a pure function of ``(seed, split, index, wording)`` (its own ``random.Random`` from an xxh3 key), so
the same arguments give byte-identical files in any process, and a larger ``n`` only appends games.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> out = Path(tempfile.mkdtemp())
    >>> paths = generate_games(out, n=2, seed=0, splits=("valid_unseen",), progress=False)
    >>> [p.relative_to(out).parts[:2] for p in paths]
    [('json_2.1.1', 'valid_unseen'), ('json_2.1.1', 'valid_unseen')]
    >>> sorted(f.name for f in paths[0].iterdir())
    ['game.tw-pddl', 'initial_state.pddl', 'traj_data.json']
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from progpo_base.usage import CommandParser
from progpo_envs.alfworld import wheel
from progpo_envs.alfworld.engine import AlfredEngine, demangled_names
from progpo_envs.alfworld.expert import ALFWorldExpert, PlaceWording, WorldState, type_name
from progpo_envs.alfworld.task_types import TaskType
from progpo_envs.core.hashing import hex_key, text_digest

GENERATOR_VERSION = 1
"""Bumped whenever the same arguments would give different files (lets caches notice stale games)."""

DATA_FOLDER = "json_2.1.1"
"""ALFWorld's data folder name, under the directory ``ALFWORLD_DATA`` points at."""

MANIFEST_NAME = "progpo_generation.json"
"""Written in each generated ``json_2.1.1/<split>/``: the generation arguments and the split's games."""

UNSEEN_SCENES = (10, 219, 308, 424)
"""The FloorPlans of ALFWorld's ``valid_unseen`` split (one kitchen, living room, bedroom and bathroom)."""

DEFAULT_NUM_GAMES = 36
"""Games per split of the default generated set (6 of each task type)."""

MAX_ATTEMPTS = 50
"""Draws per game before giving up (a draw fails when the scene cannot host the task or the replay fails)."""


class Split(str, enum.Enum):
    """The generated splits, named like ALFWorld's."""

    TRAIN = "train"
    VALID_SEEN = "valid_seen"
    VALID_UNSEEN = "valid_unseen"


TASK_ORDER: tuple[TaskType, ...] = (
    TaskType.PICK,
    TaskType.LOOK,
    TaskType.CLEAN,
    TaskType.HEAT,
    TaskType.COOL,
    TaskType.PICK_TWO,
)
"""Game ``i`` of a split has task type ``TASK_ORDER[i % 6]`` (ALFWorld's type ids 1..6): any 6 consecutive
games cover all types."""

_APPLIANCE = {TaskType.CLEAN: "SinkBasin", TaskType.HEAT: "Microwave", TaskType.COOL: "Fridge"}
_ACTION_TABLE = {TaskType.CLEAN: "Cleanable", TaskType.HEAT: "Heatable", TaskType.COOL: "Coolable"}
_TOGGLE_CLASS = "DeskLamp"
# Where ALFRED scenes stand desk lamps (a lamp must be inReceptacle something for ToggleObject to apply).
_LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf")
# Type constants alfred.pddl's actions name in their preconditions; every problem must declare them.
_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")
_BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
# ALFRED never asks to put something in a sink or bathtub basin (they are where things get cleaned).
_NEVER_GOAL = frozenset(_BASINS.values())


# --- wheel resources ---


def grammar_with_wording(grammar: str, wording: PlaceWording) -> str:
    """The grammar with ``PutObject`` worded as alfworld 0.4 (``move O to R``) or older (``put O in/on R``).

    Older ALFWorld game files (and the ReAct-era prompts) say ``put mug 1 in/on coffeemachine 1`` and answer
    ``You put the mug 1 in/on the coffeemachine 1.``; 0.4 says ``move ... to ...`` / ``You move the ... to the
    ...``.

    Raises:
        ValueError: if the grammar does not contain the 0.4 wording this edits.
    """
    if wording is PlaceWording.MOVE:
        return grammar
    edits = (
        (
            'action PutObject {\n    template :: "move {o} to {r}";',
            'action PutObject {\n    template :: "put {o} in/on {r}";',
        ),
        ('"You move the {o.name} to the {r.name}."', '"You put the {o.name} in/on the {r.name}."'),
        (
            "move (object) to (receptacle):  place an object in or on a receptacle",
            "put (object) in/on (receptacle): place an object in or on a receptacle",
        ),
    )
    for old, new in edits:
        if grammar.count(old) != 1:
            raise ValueError(f"grammar does not contain the alfworld 0.4 text {old!r} exactly once")
        grammar = grammar.replace(old, new)
    return grammar


# Imported through wheel: a plain ``import alfworld`` sets $ALFWORLD_DATA as a side effect.
@functools.cache
def _constants() -> Any:
    return wheel.import_alfworld("alfworld.gen.constants")


@functools.cache
def _goals() -> dict[str, Any]:
    return wheel.import_alfworld("alfworld.gen.goal_library").gdict


@functools.cache
def pickable_classes() -> frozenset[str]:
    """Object classes some receptacle can hold (``VAL_RECEPTACLE_OBJECTS``), without the sliced variants."""
    constants = _constants()
    held = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
    return frozenset(c for c in held if not c.endswith("Sliced"))


def _room_of(scene: int) -> str:
    for room, numbers in _constants().SCENE_TYPE.items():
        if scene in numbers:
            return room
    raise ValueError(f"FloorPlan{scene} is not in any ALFRED room range")


# --- scenes ---


@dataclasses.dataclass(frozen=True)
class ReceptacleSpec:
    """One receptacle of a scene: THOR id (``Cabinet|+00.25|+02.13|+00.43``), class and location id."""

    thor_id: str
    cls: str
    location: str


@dataclasses.dataclass(frozen=True)
class Scene:
    """What the generator uses of an AI2-THOR FloorPlan."""

    number: int
    room: str
    receptacles: tuple[ReceptacleSpec, ...]
    object_classes: tuple[str, ...]

    def receptacle_classes(self) -> set[str]:
        return {r.cls for r in self.receptacles}


def _location_id(pose: Sequence[float]) -> str:
    """ALFRED's location id of an agent pose ``[x, z, rotation, horizon]`` (0.25 m cells, rotation / 90)."""
    x, z, rotation, horizon = pose
    return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{round(rotation / 90) % 4}|{round(horizon)}"


@functools.cache
def load_scene(number: int) -> Scene:
    """Read FloorPlan ``number`` from the wheel's layouts."""
    constants = _constants()
    layouts = wheel.wheel_data_dir().parent / "gen" / "layouts"
    objects = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    poses = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    static = set(constants.RECEPTACLES) - set(constants.MOVABLE_RECEPTACLES)
    receptacles = []
    for thor_id in sorted(poses):
        cls = thor_id.split("|", 1)[0]
        if cls in _BASINS:
            receptacles.append(
                ReceptacleSpec(f"{thor_id}|{_BASINS[cls]}", _BASINS[cls], _location_id(poses[thor_id]))
            )
        elif cls in static:
            receptacles.append(ReceptacleSpec(thor_id, cls, _location_id(poses[thor_id])))
    listed = {r.cls for r in receptacles}
    # Static receptacles without a pose in openable.json (coffee machine, toaster, stove burner, ...): one
    # each, at a location of its own.
    for k, cls in enumerate(sorted(set(objects) & static - listed)):
        receptacles.append(
            ReceptacleSpec(f"{cls}|+00.00|+00.00|+{k:02d}.00", cls, f"loc|{-100 - k}|-100|0|0")
        )
    pickable = sorted(c for c in set(objects) if c in pickable_classes() or c == _TOGGLE_CLASS)
    return Scene(number, _room_of(number), tuple(receptacles), tuple(pickable))


def split_scenes(split: Split | str) -> tuple[int, ...]:
    """The FloorPlans of a split: ALFRED's training scenes, or for ``valid_unseen`` only the held-out four."""
    split = Split(split)
    if split is Split.VALID_UNSEEN:
        return UNSEEN_SCENES
    return tuple(n for n in _constants().TRAIN_SCENE_NUMBERS if n not in UNSEEN_SCENES)


# --- one game ---


def _mangle(thor_id: str) -> str:
    """THOR id → PDDL id, as ALFRED writes them (``|`` → ``_bar_``, ``+`` → ``_plus_``, ...)."""
    for char, word in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_"), (",", "_comma_")):
        thor_id = thor_id.replace(char, word)
    return thor_id


@dataclasses.dataclass
class _Draft:
    """A drawn task before it becomes files."""

    task_type: TaskType
    scene: Scene
    object_target: str
    parent_target: str
    toggle_target: str
    objects: list[tuple[str, str, ReceptacleSpec]]  # (thor id, class, receptacle it is in)
    start_location: str

    def pddl_params(self) -> dict[str, Any]:
        return {
            "mrecep_target": "",
            "object_sliced": False,
            "object_target": self.object_target,
            "parent_target": self.parent_target,
            "toggle_target": self.toggle_target,
        }


def _accepts(receptacle_cls: str, object_cls: str) -> bool:
    return object_cls in _constants().VAL_RECEPTACLE_OBJECTS.get(receptacle_cls, ())


def task_order(task_types: Sequence[TaskType | str] | None = None) -> tuple[TaskType, ...]:
    """The task types games cycle through: ``task_types`` in order, or all six (:data:`TASK_ORDER`)."""
    return TASK_ORDER if task_types is None else tuple(TaskType(t) for t in task_types)


def task_scenes(task_type: TaskType, split: Split, scenes: Sequence[int] | None = None) -> list[int]:
    """The FloorPlans of ``split`` whose room can host ``task_type`` (ALFRED's ``GOALS_VALID``), optionally
    only those in ``scenes``."""
    rooms = _constants().GOALS_VALID[task_type.value]
    allowed = None if scenes is None else set(scenes)
    return [n for n in split_scenes(split) if _room_of(n) in rooms and (allowed is None or n in allowed)]


def _draw(
    rng: random.Random, task_type: TaskType, split: Split, scenes: Sequence[int] | None = None
) -> _Draft | None:
    """Draw a scene, targets and a placement; ``None`` when the drawn scene cannot host the task."""
    constants = _constants()
    scene = load_scene(rng.choice(task_scenes(task_type, split, scenes)))
    classes = scene.receptacle_classes()
    appliance = _APPLIANCE.get(task_type)
    if appliance is not None and appliance not in classes:
        return None
    candidates = [c for c in scene.object_classes if c != _TOGGLE_CLASS]
    if task_type in _ACTION_TABLE:
        candidates = [c for c in candidates if c in constants.VAL_ACTION_OBJECTS[_ACTION_TABLE[task_type]]]
    if not candidates:
        return None
    object_target = rng.choice(candidates)
    parent_target, toggle_target = "", ""
    lamp_hosts: list[ReceptacleSpec] = []
    if task_type is TaskType.LOOK:
        lamp_hosts = [r for r in scene.receptacles if r.cls in _LAMP_HOSTS]
        if _TOGGLE_CLASS not in scene.object_classes or not lamp_hosts:
            return None
        toggle_target = _TOGGLE_CLASS
    else:
        parents = sorted(c for c in classes - _NEVER_GOAL if c != appliance and _accepts(c, object_target))
        if not parents:
            return None
        parent_target = rng.choice(parents)
    # Targets start anywhere that can hold them except in a goal-class receptacle.
    sources = [r for r in scene.receptacles if _accepts(r.cls, object_target) and r.cls != parent_target]
    if not sources:
        return None
    count = rng.randint(2, 4) if task_type is TaskType.PICK_TWO else rng.randint(1, 3)
    objects = [(f"{object_target}|{k + 1}", object_target, rng.choice(sources)) for k in range(count)]
    if task_type is TaskType.LOOK:
        objects.append((f"{_TOGGLE_CLASS}|1", _TOGGLE_CLASS, rng.choice(lamp_hosts)))
    distractor_classes = [c for c in scene.object_classes if c not in (object_target, _TOGGLE_CLASS)]
    counts: dict[str, int] = {}
    for _ in range(rng.randint(8, 15)) if distractor_classes else ():
        cls = rng.choice(distractor_classes)
        hosts = [r for r in scene.receptacles if _accepts(r.cls, cls)]
        if hosts:
            counts[cls] = counts.get(cls, 0) + 1
            objects.append((f"{cls}|{counts[cls]}", cls, rng.choice(hosts)))
    used = {r.location for r in scene.receptacles}
    start = "loc|0|0|0|30"
    while start in used:
        start = f"loc|{rng.randint(-40, 40)}|{rng.randint(-40, 40)}|{rng.randint(0, 3)}|30"
    return _Draft(task_type, scene, object_target, parent_target, toggle_target, objects, start)


def _problem(draft: _Draft, name: str) -> str:
    """The PDDL problem of a draft (the content of ``initial_state.pddl``)."""
    constants = _constants()
    receptacles = draft.scene.receptacles
    object_classes = sorted({cls for _, cls, _ in draft.objects} | set(_DOMAIN_OTYPES))
    receptacle_classes = sorted({r.cls for r in receptacles} | set(_DOMAIN_RTYPES))
    locations = sorted({r.location for r in receptacles} | {draft.start_location})
    objects = sorted(draft.objects)
    declarations = ["agent1 - agent"]
    declarations += [f"{c}Type - otype" for c in object_classes]
    declarations += [f"{c}Type - rtype" for c in receptacle_classes]
    declarations += [f"{_mangle(thor_id)} - object" for thor_id, _, _ in objects]
    declarations += [f"{_mangle(r.thor_id)} - receptacle" for r in receptacles]
    declarations += [f"{_mangle(loc)} - location" for loc in locations]

    facts = [f"(atLocation agent1 {_mangle(draft.start_location)})"]
    for r in receptacles:
        rid = _mangle(r.thor_id)
        facts.append(f"(receptacleType {rid} {r.cls}Type)")
        facts.append(f"(receptacleAtLocation {rid} {_mangle(r.location)})")
        if r.cls in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {rid})")
    present = {cls for _, cls, _ in objects}
    for rc in sorted({r.cls for r in receptacles}):
        facts += [f"(canContain {rc}Type {oc}Type)" for oc in sorted(present) if _accepts(rc, oc)]
    action_predicates = (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"))
    for thor_id, cls, receptacle in objects:
        oid = _mangle(thor_id)
        facts.append(f"(objectType {oid} {cls}Type)")
        facts.append(f"(inReceptacle {oid} {_mangle(receptacle.thor_id)})")
        facts.append(f"(objectAtLocation {oid} {_mangle(receptacle.location)})")
        if cls == _TOGGLE_CLASS:
            facts.append(f"(toggleable {oid})")
            continue
        facts.append(f"(pickupable {oid})")
        if cls in constants.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {oid})")
        for table, predicate in action_predicates:
            if cls in constants.VAL_ACTION_OBJECTS[table]:
                facts.append(f"({predicate} {oid})")
    goal = _goals()[draft.task_type.value]["pddl"].replace("#", "-")
    goal = goal.format(obj=draft.object_target, recep=draft.parent_target, toggle=draft.toggle_target)
    body = "\n        ".join(declarations)
    init = "\n        ".join(facts)
    return (
        f"(define (problem plan_{name})\n(:domain alfred)\n(:objects\n        {body}\n        )\n\n"
        f"(:init\n        {init}\n        )\n\n{goal.strip()}\n"
    )


def _display_names(draft: _Draft) -> dict[str, str]:
    """PDDL id → the name the agent sees, as the engine names it (ALFWorld's unshuffled ``Demangler``).

    The engine lower-cases ids while parsing; instances of a class are numbered in sorted id order.
    """
    ids = [_mangle(t).lower() for t, _, _ in draft.objects]
    ids += [_mangle(r.thor_id).lower() for r in draft.scene.receptacles]
    ids += sorted(
        {_mangle(r.location).lower() for r in draft.scene.receptacles}
        | {_mangle(draft.start_location).lower()}
    )
    return demangled_names(ids)


def _initial_world(draft: _Draft, names: dict[str, str]) -> WorldState:
    """The expert's view of the draft's initial state (what the engine's facts will say)."""
    constants = _constants()

    def name(thor_id: str) -> str:
        return names[_mangle(thor_id).lower()]

    state = WorldState(agent_location=name(draft.start_location))
    for r in draft.scene.receptacles:
        state.receptacle_location[name(r.thor_id)] = name(r.location)
        state.receptacle_type[name(r.thor_id)] = type_name(r.cls)
        if r.cls in constants.OPENABLE_CLASS_SET:
            state.openable.add(name(r.thor_id))
    present = {cls for _, cls, _ in draft.objects}
    for r in draft.scene.receptacles:
        state.can_contain |= {(type_name(r.cls), type_name(oc)) for oc in present if _accepts(r.cls, oc)}
    for thor_id, cls, receptacle in draft.objects:
        obj = name(thor_id)
        state.object_type[obj] = type_name(cls)
        state.containers[obj] = [name(receptacle.thor_id)]
        if cls == _TOGGLE_CLASS:
            state.flags.setdefault("toggleable", set()).add(obj)
        else:
            state.pickupable.add(obj)
    return state


@functools.lru_cache(maxsize=1)
def _replay_engine() -> AlfredEngine:
    # Generated games are played once here: keeping one loaded game is enough.
    return AlfredEngine(max_cached_games=1)


def replay_walkthrough(game: dict[str, Any], walkthrough: Sequence[str]) -> bool:
    """Whether ``walkthrough`` wins ``game`` in the real engine: all commands admissible, won at the last."""
    engine = _replay_engine()
    engine.reset(game, key=hex_key(text_digest(game["pddl_problem"] + game["grammar"])))
    for step, command in enumerate(walkthrough):
        if engine.won or command not in engine.admissible_commands:
            return False
        engine.step(command)
        if engine.won != (step == len(walkthrough) - 1):
            return False
    return bool(walkthrough) and engine.won


@dataclasses.dataclass
class GeneratedGame:
    """One generated game and where it goes.

    Attributes:
        relative_dir: ``json_2.1.1/<split>/<task folder>/<trial>`` (POSIX, relative to the output root).
        files: File name → exact text (``game.tw-pddl``, ``initial_state.pddl``, ``traj_data.json``).
        walkthrough: The verified winning command list.
        attempts: How many draws it took.
    """

    relative_dir: str
    files: dict[str, str]
    walkthrough: list[str]
    attempts: int


def make_game(
    seed: int,
    split: Split | str,
    index: int,
    wording: PlaceWording | str = PlaceWording.MOVE,
    task_types: Sequence[TaskType | str] | None = None,
    scenes: Sequence[int] | None = None,
) -> GeneratedGame:
    """Generate and verify game ``index`` of ``split`` (a pure function of the arguments).

    ``task_types`` (default: all six, :data:`TASK_ORDER`) are cycled through by index; ``scenes`` keeps the
    draws to those FloorPlans (default: every scene of the split).

    Raises:
        RuntimeError: if no verified game came out of :data:`MAX_ATTEMPTS` draws.
    """
    split, wording = Split(split), PlaceWording(wording)
    order = task_order(task_types)
    task_type = order[index % len(order)]
    # The default set keeps its historical keys; a restricted set salts them with its restriction.
    salt = "" if task_types is None and scenes is None else f"/{restriction_key(order, scenes)}"
    domain = wheel.wheel_domain()
    grammar = grammar_with_wording(wheel.wheel_grammar(), wording)
    for attempt in range(MAX_ATTEMPTS):
        key = hex_key(
            text_digest(
                f"progpo-alfworld-gen/v{GENERATOR_VERSION}/{seed}/{split.value}/{index}/{attempt}{salt}"
            )
        )
        rng = random.Random(int(key, 16))
        draft = _draw(rng, task_type, split, scenes)
        if draft is None:
            continue
        trial = f"trial_G{index:06d}_{key[:12]}"
        traj_data = {
            "task_id": trial,
            "task_type": task_type.value,
            "pddl_params": draft.pddl_params(),
            "scene": {"floor_plan": f"FloorPlan{draft.scene.number}", "scene_num": draft.scene.number},
            "generator": {
                "name": "progpo_envs.alfworld.generator",
                "version": GENERATOR_VERSION,
                "seed": seed,
                "split": split.value,
                "index": index,
                "attempt": attempt,
                "wording": wording.value,
            },
        }
        task_text = wheel.templated_task_description(traj_data, rng)
        traj_data["generator"]["task_desc"] = task_text
        walkthrough = ALFWorldExpert(traj_data, wording).plan_state(
            _initial_world(draft, _display_names(draft))
        )
        problem = _problem(draft, trial)
        game = {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", task_text),
            "pddl_problem": problem,
            "solvable": True,
            "walkthrough": walkthrough,
        }
        if not walkthrough or not replay_walkthrough(game, walkthrough):
            continue
        second = draft.toggle_target if task_type is TaskType.LOOK else draft.parent_target
        folder = f"{task_type.value}-{draft.object_target}-None-{second}-{draft.scene.number}"
        files = {
            "game.tw-pddl": json.dumps(game, indent=2) + "\n",
            "initial_state.pddl": problem,
            "traj_data.json": json.dumps(traj_data, indent=2, sort_keys=True) + "\n",
        }
        return GeneratedGame(f"{DATA_FOLDER}/{split.value}/{folder}/{trial}", files, walkthrough, attempt + 1)
    raise RuntimeError(
        f"no solvable {task_type.value} game for split={split.value} index={index} seed={seed}"
    )


# --- many games ---


def restriction_key(task_types: Sequence[TaskType], scenes: Sequence[int] | None) -> str:
    """A stable text naming a restriction (part of the draw seeds and of the cache folder)."""
    scene_part = "all" if scenes is None else "+".join(str(n) for n in sorted(set(scenes)))
    return f"types={'+'.join(t.value for t in task_types)};scenes={scene_part}"


def check_restriction(
    splits: Iterable[Split | str], task_types: Sequence[TaskType | str] | None, scenes: Sequence[int] | None
) -> None:
    """Raise ``ValueError`` unless every requested task type has a scene to be drawn in, in every split."""
    for split in splits:
        for task_type in task_order(task_types):
            if not task_scenes(task_type, Split(split), scenes):
                raise ValueError(
                    f"no scene of split {Split(split).value!r} in scenes={list(scenes or [])} can host "
                    f"{task_type.value} (rooms: {sorted(_constants().GOALS_VALID[task_type.value])}; "
                    f"valid_unseen has only FloorPlans {list(UNSEEN_SCENES)})"
                )


def _make_game_job(job: tuple) -> GeneratedGame:
    return make_game(*job)


def generate_games(
    out_dir: str | os.PathLike[str],
    n: int,
    seed: int = 0,
    splits: Iterable[Split | str] = tuple(Split),
    wording: PlaceWording | str = PlaceWording.MOVE,
    workers: int | None = None,
    progress: bool = True,
    task_types: Sequence[TaskType | str] | None = None,
    scenes: Sequence[int] | None = None,
) -> list[Path]:
    """Generate ``n`` verified games per split under ``out_dir/json_2.1.1/<split>/``.

    Args:
        out_dir: The data root (what ``ALFWORLD_DATA`` would point at).
        n: Games per split; game ``i`` has task type ``TASK_ORDER[i % 6]``.
        seed: The generation seed.
        splits: Which of ``train``, ``valid_seen``, ``valid_unseen``.
        wording: ``"move"`` (alfworld 0.4 grammar) or ``"put"`` (older releases' ``put O in/on R``).
        workers: Processes that generate and verify in parallel (default: one per CPU, at most 4); the files
            do not depend on it.
        progress: Show a progress bar.
        task_types: Only these task types, cycled by index (default: all six).
        scenes: Only these FloorPlans (default: every scene of each split), e.g. a few small bedrooms for a
            task family a tiny model can learn on a CPU.

    Returns:
        The trial folders written, in (split, index) order.

    Raises:
        ValueError: for a negative ``n`` or an unknown split or wording.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    split_list = [Split(s) for s in splits]
    wording = PlaceWording(wording)
    check_restriction(split_list, task_types, scenes)
    types = None if task_types is None else tuple(TaskType(t).value for t in task_types)
    scene_list = None if scenes is None else tuple(sorted(set(int(n) for n in scenes)))
    root = Path(out_dir)
    jobs = [
        (seed, split.value, index, wording.value, types, scene_list)
        for split in split_list
        for index in range(n)
    ]
    if workers is None:
        # A worker and its engine cost about one game to start: below a few games each, one process wins.
        workers = min(4, os.cpu_count() or 1, len(jobs) // 4)
    workers = max(1, min(workers, len(jobs)))
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc="generating ALFWorld games", unit="game", disable=not progress)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            games = []
            for game in pool.map(_make_game_job, jobs, chunksize=1):
                games.append(game)
                bar.update()
    else:
        games = []
        for job in jobs:
            games.append(_make_game_job(job))
            bar.update()
    bar.close()
    written = []
    for game in games:
        folder = root / game.relative_dir
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in game.files.items():
            (folder / name).write_text(text, encoding="utf-8")
        written.append(folder)
    for split in split_list:
        manifest = {
            "generator": "progpo_envs.alfworld.generator",
            "version": GENERATOR_VERSION,
            "seed": seed,
            "n": n,
            "split": split.value,
            "wording": wording.value,
            "task_types": list(types) if types else None,
            "scenes": list(scene_list) if scene_list else None,
            "games": [
                g.relative_dir for g in games if g.relative_dir.startswith(f"{DATA_FOLDER}/{split.value}/")
            ],
        }
        split_dir = root / DATA_FOLDER / split.value
        split_dir.mkdir(parents=True, exist_ok=True)
        (split_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return written


def generate_main(argv: list[str] | None = None) -> int:
    """The ``progpo alfworld generate`` command: ``--out DIR --n N --seed S`` (see ``--help``)."""
    parser = CommandParser(
        prog="progpo alfworld generate",
        description="Generate verified ALFWorld games (all six task types) in ALFWorld's json_2.1.1 layout.",
    )
    parser.add_argument("--out", required=True, help="output root (the folder that will contain json_2.1.1/)")
    parser.add_argument("--n", type=int, default=DEFAULT_NUM_GAMES, help="games per split")
    parser.add_argument("--seed", type=int, default=0, help="generation seed")
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=[s.value for s in Split],
        default=[s.value for s in Split],
        help="splits to generate",
    )
    parser.add_argument(
        "--wording",
        choices=[w.value for w in PlaceWording],
        default=PlaceWording.MOVE.value,
        help="placing command: 'move O to R' (alfworld 0.4) or 'put O in/on R' (older releases)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="parallel processes (default: one per CPU, <= 4)"
    )
    parser.add_argument(
        "--task-types",
        nargs="+",
        choices=[t.value for t in TaskType],
        default=None,
        help="only these task types (default: all six)",
    )
    parser.add_argument(
        "--scenes", nargs="+", type=int, default=None, help="only these FloorPlan numbers (default: all)"
    )
    args = parser.parse_args(argv)
    if args.n < 0 or (args.workers is not None and args.workers < 1):
        parser.error("--n must be >= 0 and --workers >= 1")
    started = time.perf_counter()
    try:
        paths = generate_games(
            args.out,
            args.n,
            args.seed,
            args.splits,
            args.wording,
            args.workers,
            task_types=args.task_types,
            scenes=args.scenes,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"wrote {len(paths)} games to {Path(args.out) / DATA_FOLDER} in {time.perf_counter() - started:.1f} s"
    )
    return 0
