"""The real ALFWorld engine: TextWorld's ``PddlEnv`` (fast-downward backend) with ALFWorld's object naming.

:class:`AlfredEngine` wraps ``textworld.envs.pddl.PddlEnv`` directly (not through ``textworld.gym``), names
objects as ALFWorld's ``AlfredDemangler`` does (``"<class> <n>"``), keeps every loaded game so that replaying
one (as group RL does) skips the grammar parse and the PDDL translation, and applies four fixes to the stock
engine (see ``docs/alfworld.md`` §3). Each fix is switchable through :class:`EnginePatches` and leaves
the transcript (observations + admissible commands) byte-identical to the stock engine;
``tests/progpo_envs/alfworld/test_alfworld_engine.py`` proves it.

* ``grammar_cache`` — profiling shows ~95% of a stock step re-parsing the same grammar strings with TatSu:
  every step re-derives the text of every admissible command (``textgen._parse_and_convert``) and re-parses
  rule conditions (``Rule.parse_conjunctive_query``). We memoise both parses and hand out deep copies, because
  the derivation mutates the symbols it gets (their ``context``).
* ``pddl2sas_cache`` — ``PddlState`` runs ``fast_downward.pddl2sas`` twice (plain and optimised) on every load
  and every reset: ~88% of a reset. We memoise the result per (domain, problem, optimise). The cached ``task``
  object is only read by ``PddlState``.
* ``restore_argv`` — ``pddl2sas`` overwrites ``sys.argv`` with ``["translate.py", "domain", "task"]``, which
  breaks any command-line program that reads its arguments afterwards; we put ``sys.argv`` back.
* ``shallow_context_copy`` (a fourth fix, found by profiling the patched engine: ~80% of what remains of a
  step is ``copy.deepcopy``) — ``textgen.copy_context`` deep-copies the ``variables`` (entity infos) and
  ``mapping`` (placeholder → variable) dicts for every symbol derived. The derivation only adds keys to these
  dicts (``query`` updates them) and never mutates their values, so copying the dicts themselves gives the
  same text.

Each ``PddlEnv`` loads a copy of ``libdownward`` of its own (``fast_downward.load_lib``: its planner state is
global to the library) that TextWorld never unloads, some 2 MiB a copy: a closed engine hands its ``PddlEnv``
to the next engine of the process (:data:`_IDLE_PDDL_ENVS`), so a process holds as many copies as it ever had
engines open at once, not one per engine it ever made (an env server whose sessions come and go: an ALFWorld
OpenEnv worker grew from 81 to 544 MiB over 200 sessions of one env each; ``scripts/serving_probe.py``).

The patches are installed once per process as thin wrappers that consult the patch set of the engine currently
calling into TextWorld (a context variable), so patched and stock engines can live in one process (the
benchmark and the byte-identity tests compare them side by side).

Example:
    >>> from progpo_envs.alfworld.engine import AlfredEngine
    >>> engine = AlfredEngine()  # doctest: +SKIP
    >>> obs = engine.reset("path/to/game.tw-pddl")  # doctest: +SKIP
    >>> engine.step("go to desk 1")  # doctest: +SKIP
    'You arrive at desk 1. On the desk 1, you see a pen 1.'
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import json
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fast_downward
import textworld
import textworld.envs.pddl.logic as pddl_logic
import textworld.envs.pddl.textgen as textgen
from textworld.envs.pddl import PddlEnv
from textworld.logic import Proposition, Rule, Variable

#: What the stock engine says to a command that is not admissible.
NOTHING_HAPPENS = "Nothing happens."


@dataclasses.dataclass(frozen=True)
class EnginePatches:
    """Which fixes to the stock engine are on (all by default; all off is the stock engine)."""

    #: Memoise TatSu parses of grammar strings and rule conditions (returns deep copies).
    grammar_cache: bool = True
    #: Memoise ``fast_downward.pddl2sas`` per (domain, problem, optimise).
    pddl2sas_cache: bool = True
    #: Restore ``sys.argv`` after ``fast_downward.pddl2sas`` overwrites it.
    restore_argv: bool = True
    #  Copy derivation contexts shallowly (the stock ``textgen.copy_context`` deep-copies every entity per
    # symbol).
    shallow_context_copy: bool = True

    @classmethod
    def stock(cls) -> EnginePatches:
        """No fix: the engine exactly as TextWorld ships it."""
        return cls(grammar_cache=False, pddl2sas_cache=False, restore_argv=False, shallow_context_copy=False)


# --- the patches --------------------------------------------------------------------------------------------

_ACTIVE: contextvars.ContextVar[EnginePatches] = contextvars.ContextVar(
    "alfworld_engine_patches",
    default=EnginePatches.stock(),  # noqa: B039  (a frozen dataclass)
)
_PARSE_CACHE_SIZE = 8192
_PDDL2SAS_CACHE_SIZE = 64


class _LRU:
    """A small thread-safe LRU map (``functools.lru_cache`` cannot bypass itself per call)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is not _MISSING:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


_MISSING = object()
_TEXTGEN_PARSES = _LRU(_PARSE_CACHE_SIZE)
_QUERY_PARSES = _LRU(_PARSE_CACHE_SIZE)
_PDDL2SAS_RESULTS = _LRU(_PDDL2SAS_CACHE_SIZE)
#: Loaded games shared by every engine of the process (the copies of a task group load a game once).
#: Sharing is safe: a loaded game's grammar, actions and entity names are only read while playing, and each
#: engine plays on its own ``PddlState`` and ``libdownward`` copy.
_SHARED_GAMES = _LRU(64)


#: What every engine asks of TextWorld (so any idle ``PddlEnv`` serves any engine).
_INFOS = textworld.EnvInfos(won=True, admissible_commands=True)
#: ``PddlEnv``\ s of closed engines (their ``libdownward`` copies), for the next engines of the process.
_IDLE_PDDL_ENVS: list[PddlEnv] = []
_IDLE_LOCK = threading.Lock()


def _take_pddl_env() -> PddlEnv:
    """An idle ``PddlEnv`` of a closed engine, or a new one (which loads a ``libdownward`` copy)."""
    with _IDLE_LOCK:
        if _IDLE_PDDL_ENVS:
            return _IDLE_PDDL_ENVS.pop()
    return PddlEnv(_INFOS)


def _give_back_pddl_env(env: PddlEnv) -> None:
    """``env`` idle, without its last game (the loaded games live on in the caches), for the next engine."""
    for name in ("_pddl_state", "state", "prev_state", "_game_data", "_game_file", "_logic", "_entity_infos"):
        setattr(env, name, None)
    env.walkthrough = None
    with _IDLE_LOCK:
        _IDLE_PDDL_ENVS.append(env)


def clear_caches() -> None:
    """Forget every memoised parse and translation (tests and benchmarks measure cold starts with it)."""
    for cache in (_TEXTGEN_PARSES, _QUERY_PARSES, _PDDL2SAS_RESULTS, _SHARED_GAMES):
        cache.clear()


def _cached_textgen_parse(original, *args, **kwargs):
    # Only the plain call shape is memoised; tracing (``TW_CSG_TRACE``) must reach TatSu every time.
    if (
        not _ACTIVE.get().grammar_cache
        or len(args) != 1
        or set(kwargs) - {"rule_name", "trace"}
        or kwargs.get("trace")
    ):
        return original(*args, **kwargs)
    key = (args[0], kwargs.get("rule_name"))
    parsed = _TEXTGEN_PARSES.get(key)
    if parsed is _MISSING:
        parsed = original(*args, **kwargs)
        _TEXTGEN_PARSES.put(key, parsed)
    return copy.deepcopy(parsed)


def _cached_conjunctive_query(original, expr: str) -> Rule:
    if not _ACTIVE.get().grammar_cache:
        return original(expr)
    rule = _QUERY_PARSES.get(expr)
    if rule is _MISSING:
        rule = original(expr)
        _QUERY_PARSES.put(expr, rule)
    return copy.deepcopy(rule)


def _patched_pddl2sas(original, domain: str, problem: str, verbose: bool = False, optimize: bool = False):
    patches = _ACTIVE.get()
    cacheable = patches.pddl2sas_cache and not verbose
    key = (domain, problem, bool(optimize))
    if cacheable:
        result = _PDDL2SAS_RESULTS.get(key)
        if result is not _MISSING:
            return result
    saved_argv = list(sys.argv)
    try:
        result = original(domain, problem, verbose=verbose, optimize=optimize)
    finally:
        if patches.restore_argv:
            sys.argv[:] = saved_argv
    if cacheable:
        _PDDL2SAS_RESULTS.put(key, result)
    return result


def _context_copy(original, context: dict) -> dict:
    if not _ACTIVE.get().shallow_context_copy:
        return original(context)
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


@functools.cache
def _install_patches() -> None:
    """Wrap the patched engine functions once per process; they obey the active :class:`EnginePatches`."""
    original_parse = textgen._parse_and_convert
    textgen._parse_and_convert = functools.wraps(original_parse)(
        functools.partial(_cached_textgen_parse, original_parse)
    )

    original_query = Rule.parse_conjunctive_query.__func__

    def parse_conjunctive_query(cls, expr: str) -> Rule:
        return _cached_conjunctive_query(functools.partial(original_query, cls), expr)

    Rule.parse_conjunctive_query = classmethod(functools.wraps(original_query)(parse_conjunctive_query))

    original_copy_context = textgen.copy_context
    textgen.copy_context = functools.wraps(original_copy_context)(
        functools.partial(_context_copy, original_copy_context)
    )

    # ``PddlState`` calls ``fast_downward.pddl2sas`` through the package attribute.
    original_pddl2sas = fast_downward.pddl2sas
    fast_downward.pddl2sas = functools.wraps(original_pddl2sas)(
        functools.partial(_patched_pddl2sas, original_pddl2sas)
    )
    assert pddl_logic.fast_downward is fast_downward


@contextlib.contextmanager
def active_patches(patches: EnginePatches) -> Iterator[None]:
    """Run the enclosed engine calls with ``patches`` on."""
    _install_patches()
    token = _ACTIVE.set(patches)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


# --- naming -------------------------------------------------------------------------------------------------


def demangled_names(object_ids: list[str]) -> dict[str, str]:
    """ALFWorld's display names for PDDL object ids: ``"<class> <n>"``, numbered per class in sorted-id order.

    Reproduces ``alfworld.agents.utils.misc.Demangler`` (``shuffle=False``, the evaluation setting) as applied
    by ``AlfredDemangler``: ids are sorted, the class is the text before the first ``_bar_`` (plus ``basin``
    for sink/bathtub basins), and instances of a class are numbered from the *last* sorted id downwards
    (upstream pops from the end of ``[1..count]``). Ids without ``_bar_`` (``agent1``, locations' types) keep
    their text and a trailing space, exactly as upstream prints them.

    Example:
        >>> names = demangled_names(["mug_bar__plus_01", "mug_bar__minus_02", "sink_bar_00_bar_sinkbasin"])
        >>> names["mug_bar__minus_02"], names["mug_bar__plus_01"], names["sink_bar_00_bar_sinkbasin"]
        ('mug 2', 'mug 1', 'sinkbasin 1')
        >>> demangled_names(["agent1"])
        {'agent1': 'agent1 '}
    """
    ids = sorted(object_ids)
    counts: Counter[str] = Counter()
    for object_id in ids:
        name, sep, _ = object_id.partition("_bar_")
        if sep:
            counts[name + ("basin" if "basin" in object_id else "")] += 1
    numbers = {name: list(range(1, count + 1)) for name, count in counts.items()}
    names = {}
    for object_id in ids:
        text = (
            object_id.replace("_bar_", "|")
            .replace("_minus_", "-")
            .replace("_plus_", "+")
            .replace("_dot_", ".")
            .replace("_comma_", ",")
        )
        name, sep, _ = text.partition("|")
        if not sep:
            names[object_id] = f"{text} "
        else:
            name += "basin" if "basin" in object_id else ""
            names[object_id] = f"{name} {numbers[name].pop()}"
    return names


# --- the engine ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _LoadedGame:
    """What ``PddlEnv.load`` computes once per game and reset reuses."""

    data: Mapping[str, Any]
    logic: Any
    entity_infos: dict[str, Any]
    game_file: str | None


class AlfredEngine:
    """One TextWorld ``PddlEnv`` (with its own copy of ``libdownward``) that plays ALFWorld games.

    Loaded games are shared by the engines of a process and each engine keeps its own (up to
    ``max_cached_games``, least recently used first out), so resetting a game
    again skips the grammar parse and, with the ``pddl2sas`` patch, the PDDL translation.

    Args:
        patches: Which fixes to the stock engine are on.
        max_cached_games: Loaded games kept for cheap resets.
    """

    def __init__(self, patches: EnginePatches | None = None, max_cached_games: int = 16):
        self.patches = patches if patches is not None else EnginePatches()
        self.max_cached_games = max_cached_games
        with active_patches(self.patches):
            self._env: PddlEnv | None = _take_pddl_env()
        self._games: OrderedDict[str, _LoadedGame] = OrderedDict()
        self._game_key: str | None = None
        self._state: Any = None
        self._feedback = ""

    # --- loading and playing ---
    def reset(self, game: str | Path | Mapping[str, Any], key: str | None = None) -> str:
        """Start ``game`` (a ``game.tw-pddl`` path or its JSON) from its initial state; returns the intro.

        Args:
            game: The game file or its data.
            key: Cache key of the game, unique in the process (default: the resolved path; required when
                ``game`` is data).
        """
        if key is None:
            if isinstance(game, Mapping):
                raise ValueError("pass key= to identify a game given as data")
            key = str(Path(game).resolve())
        with active_patches(self.patches):
            if self._env is None:  # reset after close: the engine takes a PddlEnv again
                self._env = _take_pddl_env()
            loaded = self._games.get(key)
            if loaded is None:
                loaded = _SHARED_GAMES.get(key)
                if loaded is _MISSING:
                    loaded = self._load(game)
                    _SHARED_GAMES.put(key, loaded)
                self._games[key] = loaded
                while len(self._games) > self.max_cached_games:
                    self._games.popitem(last=False)
            self._games.move_to_end(key)
            self._install(loaded)
            self._game_key = key
            self._state = self._env.reset()
        self._feedback = self._state.feedback
        return self._feedback

    def step(self, command: str) -> str:
        """Apply ``command``; a command that is not admissible gives ``"Nothing happens."``."""
        if self._state is None:
            raise RuntimeError("reset() a game before step()")
        if command.strip() not in self._state["_valid_commands"]:
            # The stock engine looks the command up in the same list and, failing, answers "Nothing happens."
            # and re-derives the unchanged state's commands; we skip that (the transcript is the same).
            self._feedback = NOTHING_HAPPENS
            return self._feedback
        with active_patches(self.patches):
            self._state, _, _ = self._env.step(command)
        self._feedback = self._state.feedback
        return self._feedback

    def _load(self, game: str | Path | Mapping[str, Any]) -> _LoadedGame:
        """``PddlEnv.load`` followed by ALFWorld's demangling (what ``AlfredDemangler.load`` does)."""
        self._env.load(str(game) if isinstance(game, Path) else game)
        names = demangled_names([info.id for info in self._env._entity_infos.values()])
        for info in self._env._entity_infos.values():
            info.name = names[info.id]
        return _LoadedGame(
            data=self._env._game_data,
            logic=self._env._logic,
            entity_infos=self._env._entity_infos,
            game_file=self._env._game_file,
        )

    def _install(self, loaded: _LoadedGame) -> None:
        """Make ``loaded`` the current game of the ``PddlEnv`` without re-running ``load``."""
        env = self._env
        env._game_data = loaded.data
        env._game_file = loaded.game_file
        env.walkthrough = loaded.data.get("walkthrough")
        env._logic = loaded.logic
        env._entity_infos = loaded.entity_infos

    # --- state the env and the expert read ---
    @property
    def feedback(self) -> str:
        """The text of the last reset or step."""
        return self._feedback

    @property
    def admissible_commands(self) -> list[str]:
        """The engine's admissible commands (sorted, deduplicated, ``help`` included) in the current state."""
        return list(self._state["admissible_commands"])

    @property
    def won(self) -> bool:
        """Whether the goal holds in the current state."""
        return bool(self._state["won"])

    @property
    def game_data(self) -> Mapping[str, Any]:
        """The current game's ``game.tw-pddl`` content (``pddl_domain``, ``grammar``, ``pddl_problem``)."""
        return self._env._game_data

    @property
    def names(self) -> dict[str, str]:
        """PDDL object id → display name (``"mug 1"``-style text as the observations use it)."""
        return {object_id: info.name for object_id, info in self._env._entity_infos.items()}

    def facts(self) -> list[Proposition]:
        """The true state: every current fact with display names as arguments (``EnvInfos(facts=True)``).

        Computed on demand (stock TextWorld computes it on every step when facts are requested).
        """
        infos = self._env._entity_infos
        return [
            Proposition(fact.name, [Variable(infos[v.name].name, v.type) for v in fact.arguments])
            for fact in self._env._pddl_state.facts
        ]

    def raw_facts(self) -> list[Proposition]:
        """The true state with PDDL object ids as arguments."""
        return list(self._env._pddl_state.facts)

    def close(self) -> None:
        """Forget the loaded games and hand the ``PddlEnv`` (its ``libdownward`` copy, which no close can
        unload) to the next engine of the process."""
        self._games.clear()
        self._state = None
        env, self._env = self._env, None
        if env is not None:
            _give_back_pddl_env(env)


def load_game_data(path: str | Path) -> dict[str, Any]:
    """Read a ``game.tw-pddl`` file."""
    with open(path) as f:
        return json.load(f)
