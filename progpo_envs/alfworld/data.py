"""ALFWorld task sets: real trials in ALFWorld's ``json_2.1.1`` layout, or generated games.

Real data (``data_dir=`` or ``$ALFWORLD_DATA``, the folder that *contains* ``json_2.1.1/``): the trials of
``json_2.1.1/<split>`` are collected with ALFWorld's own rules (``AlfredTWEnv.collect_game_files``): a trial
is a folder holding ``traj_data.json``; paths containing ``movable`` or ``Sliced`` are skipped; only the six
task types are kept; a trial whose ``game.tw-pddl`` says ``solvable: false`` (or lacks the key) is skipped.
Unlike ALFWorld, a trial *without* ``game.tw-pddl`` (e.g. ``initial_state.pddl`` + ``traj_data.json`` only, as
in the provided sample) or with one built from an older grammar is kept and its game is rebuilt, the way
``alfworld-play-tw`` builds it: the wheel's domain and grammar, the trial's ``initial_state.pddl``, and the
task text put in place of ``UNKNOWN GOAL``. Such a game is taken as solvable (ALFWorld's released games were
all checked with its planner, which we do not run: it can take minutes and gigabytes per game). Rebuilt games
go into a cache (``$PROGPO_CACHE`` or ``~/.cache/progpo``) under their content hash; the user's data folder is
never written to. A cached game is checked when it is used: one that is not a game file (a damaged cache
entry) is built again, and one that cannot be (a read-only cache), like a damaged game file in the data or in
a generated set, raises :class:`~progpo_envs.core.errors.EnvDataError` naming the file and the fix.

Split names are the folders of ``json_2.1.1`` (``train``, ``valid_seen``, ``valid_unseen``; the sample
provided with this project calls its training sample ``valid_train``). Tasks are sorted by their id
``<task folder>/<trial>``.

Without real data, the generator (:mod:`progpo_envs.alfworld.generator`) writes a deterministic set of games
into the cache on first use and that set is loaded the same way.

Example:
    >>> from progpo_envs.alfworld.data import load_tasks
    >>> tasks = load_tasks("valid_seen", data_dir="/data/alfworld")  # doctest: +SKIP
    >>> len(tasks), tasks[0].task_type  # doctest: +SKIP
    (140, 'look_at_obj_in_light')
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import multiprocessing
import os
import random
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import xxhash

from progpo_envs.alfworld import wheel
from progpo_envs.alfworld.expert import PlaceWording
from progpo_envs.alfworld.task_types import TASK_TYPES
from progpo_envs.core.errors import EnvDataError

#  Path fragments ALFWorld skips (movable receptacles and sliced objects are not supported by the text
# engine).
SKIPPED_PATH_PARTS = ("movable", "Sliced")
#: Bumped when the rebuilt-game format changes, so old cache entries are not reused.
_REBUILD_FORMAT = 1
#: Games per split generated when there is no real data (six of each task type).
DEFAULT_NUM_GENERATED = 36
_TASK_LINE = re.compile(r"Your task is to: (.*?)\.\"")


def cache_dir() -> Path:
    """Where generated and rebuilt games are cached: ``$PROGPO_CACHE`` or ``~/.cache/progpo``."""
    return Path(os.environ.get("PROGPO_CACHE") or Path.home() / ".cache" / "progpo")


@dataclasses.dataclass(frozen=True)
class ALFWorldTask:
    """One trial of a split.

    Attributes:
        task_id: ``<task folder>/<trial folder>``, unique within a split and stable across machines.
        task_type: One of :data:`~progpo_envs.alfworld.task_types.TASK_TYPES`.
        trial_dir: The trial folder (``traj_data.json``, ``initial_state.pddl``, maybe ``game.tw-pddl``).
        has_game_file: Whether the trial ships a ``game.tw-pddl`` (otherwise it is rebuilt).
        trust_game_file: Use the shipped game file as is, whatever grammar it has (generated games).
    """

    task_id: str
    task_type: str
    trial_dir: Path
    has_game_file: bool
    trust_game_file: bool = False

    def traj_data(self) -> dict[str, Any]:
        """The trial's ``traj_data.json`` (task type, ``pddl_params``, annotations)."""
        with open(self.trial_dir / "traj_data.json") as f:
            return json.load(f)

    def game_file(self, cache: Path | None = None) -> Path:
        """The playable ``game.tw-pddl``: the trial's own when current, else a rebuilt one in the cache.

        Raises:
            EnvDataError: The trial's own game file, or a generated one, is not a game file.
        """
        shipped = self.trial_dir / "game.tw-pddl"
        old_game = None
        if self.has_game_file:
            old_game = read_game_file(shipped)
            if old_game is None:
                fix = (
                    "delete the generated set to have it generated again"
                    if self.trust_game_file
                    else "restore the trial from the ALFWorld data"
                )
                raise EnvDataError(f"{shipped} is damaged (not a game file): {fix}")
            if self.trust_game_file or is_current_game(old_game):
                return shipped
        return rebuild_game(self, cache, old_game=old_game)


#: The keys every ``game.tw-pddl`` has (text), as :func:`build_game` writes them.
GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")


def read_game_file(path: Path) -> dict[str, Any] | None:
    """The content of a ``game.tw-pddl``, or ``None`` when it is not one (not JSON, not an object, a key of
    :data:`GAME_KEYS` missing or not text)."""
    try:
        game = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):  # unreadable, not JSON, not UTF-8
        return None
    if not isinstance(game, dict) or not all(isinstance(game.get(key), str) for key in GAME_KEYS):
        return None
    return game


def is_current_game(game: dict[str, Any]) -> bool:
    """Whether a game uses the installed wheel's domain and grammar (only the task line may differ).

    Both placing wordings count as current: the wheel's ``move X to Y`` and the ``put X in/on Y`` that the
    generator writes on request (the grammar of older ALFWorld releases).
    """
    from progpo_envs.alfworld.generator import grammar_with_wording  # (the generator loads the engine)

    if game.get("pddl_domain") != wheel.wheel_domain():
        return False
    grammar = game.get("grammar", "")
    for wording in PlaceWording:
        before, _, after = grammar_with_wording(wheel.wheel_grammar(), wording).partition("UNKNOWN GOAL")
        if grammar.startswith(before) and grammar.endswith(after):
            return True
    return False


def build_game(task: ALFWorldTask, task_description: str | None = None) -> dict[str, Any]:
    """The ``game.tw-pddl`` content of a trial, built as ``alfworld-play-tw`` does from the wheel's logic.

    The task text is ``task_description`` when given, else a template of ``goal_library`` picked with a
    generator seeded by the task id (upstream picks with the global ``random``; we keep rebuilds
    reproducible).
    """
    traj_data = task.traj_data()
    if task_description is None:
        rng = random.Random(xxhash.xxh3_64_intdigest(task.task_id.encode()))
        task_description = wheel.templated_task_description(traj_data, rng)
    return {
        "pddl_domain": wheel.wheel_domain(),
        "grammar": wheel.wheel_grammar().replace("UNKNOWN GOAL", task_description),
        "pddl_problem": (task.trial_dir / "initial_state.pddl").read_text(),
        "solvable": True,
    }


def rebuild_game(
    task: ALFWorldTask, cache: Path | None = None, old_game: dict[str, Any] | None = None
) -> Path:
    """Build (once) and cache the current-format game of ``task``; returns its path.

    An old game's task text is kept, so the rebuilt game asks the same thing with the current grammar.
    """
    description = None
    if old_game is not None:
        match = _TASK_LINE.search(old_game.get("grammar", ""))
        description = match.group(1) if match else None
    hasher = xxhash.xxh3_128()
    for part in (
        str(_REBUILD_FORMAT),
        task.task_id,
        description or "",
        wheel.wheel_domain(),
        wheel.wheel_grammar(),
        (task.trial_dir / "initial_state.pddl").read_text(),
        (task.trial_dir / "traj_data.json").read_text(),
    ):
        hasher.update(part.encode())
        hasher.update(b"\0")
    path = (cache or cache_dir()) / "alfworld" / "games" / f"{hasher.hexdigest()}.tw-pddl"
    if path.exists():
        if read_game_file(path) is not None:
            return path
        print(f"[alfworld] rebuilding the damaged cached game {path}", file=sys.stderr, flush=True)
    game = build_game(task, description)
    try:
        _atomic_write(path, json.dumps(game))
    except OSError as exc:
        state = "is damaged and cannot be rebuilt" if path.exists() else "cannot be written"
        raise EnvDataError(
            f"the cached game {path} {state} ({exc.strerror or exc}): make {path.parent} writable, or point "
            "PROGPO_CACHE at a writable folder"
        ) from exc
    return path


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so concurrent workers never read a half-written game."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def available_splits(data_dir: str | Path) -> list[str]:
    """The split folders of ``<data_dir>/json_2.1.1``."""
    root = Path(data_dir) / "json_2.1.1"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def split_names(data_dir: str | Path | None = None) -> list[str]:
    """The splits :func:`load_tasks` can load: the folders of ``json_2.1.1`` in the data (``data_dir``, else
    ``$ALFWORLD_DATA``), or the generated splits when there is no real data."""
    root = resolve_data_dir(data_dir)
    if root is not None:
        return available_splits(root)
    from progpo_envs.alfworld import generator

    return [split.value for split in generator.Split]


def collect_tasks(split_dir: Path, *, trust_game_files: bool = False) -> list[ALFWorldTask]:
    """Every playable trial under ``split_dir`` by ALFWorld's rules (module docstring), sorted by id."""
    tasks = []
    for root, _, files in os.walk(split_dir):
        if "traj_data.json" not in files:
            continue
        trial_dir = Path(root)
        task_id = trial_dir.relative_to(split_dir).as_posix()
        if any(part in task_id for part in SKIPPED_PATH_PARTS):
            continue
        # ALFRED task folders are named ``<task_type>-<object>-<mrecep>-<parent>-<scene>``; reading the type
        # from the
        # name avoids parsing every (up to 600 KB) traj_data.json of a 3553-trial train split.
        task_type = task_id.split("/", 1)[0].split("-", 1)[0]
        if task_type not in TASK_TYPES:
            task_type = json.loads((trial_dir / "traj_data.json").read_text()).get("task_type", "")
            if task_type not in TASK_TYPES:
                continue
        has_game_file = "game.tw-pddl" in files
        if has_game_file:
            try:
                solvable = json.loads((trial_dir / "game.tw-pddl").read_bytes()).get("solvable", False)
            except (ValueError, AttributeError):  # not JSON, or not an object
                raise EnvDataError(
                    f"{trial_dir / 'game.tw-pddl'} is damaged (not a game file): restore the trial from the "
                    "ALFWorld data"
                ) from None
            if not solvable:
                continue
        elif "initial_state.pddl" not in files:
            continue
        tasks.append(ALFWorldTask(task_id, task_type, trial_dir, has_game_file, trust_game_files))
    return sorted(tasks, key=lambda task: task.task_id)


#: ``data_dir`` value that asks for generated games whatever ``$ALFWORLD_DATA`` says.
GENERATED = "generated"


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """``data_dir`` if given, else ``$ALFWORLD_DATA`` if set, else ``None`` (generated games); ``data_dir`` =
    :data:`GENERATED` is ``None`` too (generated games asked for by name).

    Example:
        >>> resolve_data_dir("/data/alfworld"), resolve_data_dir(GENERATED)
        (PosixPath('/data/alfworld'), None)
    """
    if data_dir is not None:
        return None if str(data_dir) == GENERATED else Path(data_dir).expanduser()
    from_env = os.environ.get("ALFWORLD_DATA")
    return Path(from_env).expanduser() if from_env else None


def missing_data_dir(data_dir: str | Path | None) -> str | None:
    """What is wrong, with the fix, when the real data folder asked for (``data_dir``, else
    ``$ALFWORLD_DATA``) is not a folder; ``None`` when it is one, or generated games are asked for.

    Example:
        >>> missing_data_dir("/nonexistent/alfworld")  # doctest: +NORMALIZE_WHITESPACE
        'the ALFWorld data folder /nonexistent/alfworld (data_dir) does not exist: give the folder that
        contains json_2.1.1/, or unset ALFWORLD_DATA for the generated games'
    """
    root = resolve_data_dir(data_dir)
    if root is None or root.is_dir():
        return None
    given = "data_dir" if data_dir is not None else "ALFWORLD_DATA"
    state = "is not a folder" if root.exists() else "does not exist"
    return (
        f"the ALFWorld data folder {root} ({given}) {state}: give the folder that contains json_2.1.1/, or "
        "unset ALFWORLD_DATA for the generated games"
    )


def task_type_names(task_types: Sequence[str | int] | None) -> tuple[str, ...] | None:
    """Task types by name or by ALFWorld's number (``env.task_types: [1, 2]`` in its config) → names.

    Example:
        >>> task_type_names([1, "look_at_obj_in_light"])
        ('pick_and_place_simple', 'look_at_obj_in_light')
    """
    if task_types is None:
        return None
    names = []
    for t in task_types:
        if isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= len(TASK_TYPES):
            names.append(TASK_TYPES[t - 1])
        elif t in TASK_TYPES:
            names.append(str(t))
        else:
            raise ValueError(f"unknown ALFWorld task type {t!r}: use 1..6 or one of {list(TASK_TYPES)}")
    if not names:
        raise ValueError("task_types must name at least one task type")
    return tuple(names)


def scene_number(task_id: str) -> int | None:
    """The FloorPlan of a trial from its task folder name (``<type>-<object>-<mrecep>-<parent>-<scene>``)."""
    tail = task_id.split("/", 1)[0].rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def load_tasks(
    split: str = "train",
    data_dir: str | Path | None = None,
    *,
    num_generated: int | None = None,
    generator_seed: int = 0,
    task_types: Sequence[str | int] | None = None,
    scenes: Sequence[int] | None = None,
) -> list[ALFWorldTask]:
    """The tasks of ``split``, in a fixed sorted order.

    Args:
        split: A folder of ``json_2.1.1`` (``train``, ``valid_seen``, ``valid_unseen``, ``valid_train``, ...).
        data_dir: The folder containing ``json_2.1.1`` (default ``$ALFWORLD_DATA``; unset → generated games).
        num_generated: Games per split generated when there is no real data (default
            :data:`DEFAULT_NUM_GENERATED`).
        generator_seed: Seed of the generated set.
        task_types: Only these task types (names or ALFWorld's numbers 1..6, as its ``env.task_types``);
            generated sets are generated with only these types.
        scenes: Only trials in these FloorPlans; generated sets are drawn in only these scenes.

    Raises:
        FileNotFoundError: ``data_dir`` has no ``json_2.1.1/<split>``.
        ValueError: the split holds no playable trial (of the requested types and scenes).
    """
    types = task_type_names(task_types)
    scene_set = None if scenes is None else {int(n) for n in scenes}
    root = resolve_data_dir(data_dir)
    trust = root is None
    if root is None:
        root = generated_data_dir(split, num_generated, generator_seed, task_types=types, scenes=scenes)
    split_dir = root / "json_2.1.1" / split
    missing = None if trust else missing_data_dir(data_dir)
    if missing is not None:
        raise FileNotFoundError(missing)
    if not split_dir.is_dir():
        splits = available_splits(root)
        raise FileNotFoundError(
            f"no ALFWorld split {split!r} in {root}/json_2.1.1 (available: {splits or 'none'}); "
            "data_dir must be the folder that contains json_2.1.1/"
        )
    tasks = [
        task
        for task in collect_tasks(split_dir, trust_game_files=trust)
        if (types is None or task.task_type in types)
        and (scene_set is None or scene_number(task.task_id) in scene_set)
    ]
    if not tasks:
        wanted = "" if types is None and scenes is None else f" of task_types={types} in scenes={scenes}"
        raise ValueError(f"{split_dir} holds no playable ALFWorld trial{wanted}")
    return tasks


# --- generated games ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (async vector env workers may all want the same set at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.lru_cache(maxsize=1)
def _generator_fingerprint() -> str:
    """8 hex digits of xxh3 over the sources of ``progpo_envs.alfworld`` (what generated games depend on)."""
    digest = xxhash.xxh3_64()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:8]


def generated_data_dir(
    split: str,
    num_games: int | None = None,
    seed: int = 0,
    *,
    task_types: Sequence[str] | None = None,
    scenes: Sequence[int] | None = None,
) -> Path:
    """The folder (containing ``json_2.1.1``) of the generated games, generating ``split`` on first use.

    Each split is generated the first time it is asked for (``num_games`` games, one task type after the
    other), under ``<cache>/alfworld/generated/v<version>-<code digest>-n<num_games>-s<seed>/``; a lock keeps
    concurrent processes (async vector env workers) from generating it twice. The code digest covers the
    sources of this package (generator, expert walkthroughs, engine, task texts), so games cached by another
    version of the code are never reused, even where ``GENERATOR_VERSION`` was not bumped. A set restricted
    to some ``task_types``/``scenes`` gets its own folder (the key ends with a digest of the restriction).
    """
    from progpo_envs.alfworld import generator

    num_games = DEFAULT_NUM_GENERATED if num_games is None else num_games
    if split not in {s.value for s in generator.Split}:
        raise FileNotFoundError(
            f"generated games have the splits {[s.value for s in generator.Split]}, not {split!r}"
        )
    key = f"v{generator.GENERATOR_VERSION}-{_generator_fingerprint()}-n{num_games}-s{seed}"
    if task_types is not None or scenes is not None:
        restriction = generator.restriction_key(generator.task_order(task_types), scenes)
        key += "-r" + xxhash.xxh3_64_hexdigest(restriction.encode())[:8]
    out = cache_dir() / "alfworld" / "generated" / key
    done = out / f".complete-{split}"
    if done.exists():
        return out
    with _file_lock(out.with_name(f"{key}.lock")):
        if not done.exists():
            # Daemonic processes (async vector env workers) may not start a process pool.
            workers = 1 if multiprocessing.current_process().daemon else min(4, os.cpu_count() or 1)
            generator.generate_games(
                out, num_games, seed, splits=[split], workers=workers, task_types=task_types, scenes=scenes
            )
            done.write_text(key)
    return out
