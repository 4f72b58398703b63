"""The real ALFWorld engine: TextWorld's ``PddlEnv`` (fast-downward backend) with ALFWorld's object naming.

:class:`AlfredEngine` wraps ``textworld.envs.pddl.PddlEnv`` directly (not through ``textworld.gym``), names
objects as ALFWorld's ``AlfredDemangler`` does (``"<class> <n>"``), keeps every loaded game so that replaying
one (as group RL does) skips the grammar parse and the PDDL translation, and applies ten fixes to the stock
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
* ``tree_copy`` — the derivation deep-copies parse trees (every rule it expands, every symbol it instantiates,
  every cached parse it is handed) with ``copy.deepcopy``, whose generic dispatch is most of the cost; the
  trees are lists and TextWorld's five symbol classes, so they are copied object for object by a copier of
  their own (the same objects, the same sharing, ``deepcopy``'s memo), and a cached query rule is copied
  sharing its tuples of propositions (values nothing changes).
* ``command_cache`` — what remains of a step is deriving the text of every admissible command
  (``PddlEnv._gather_infos``: ~27 grammar derivations a step, each with its queries and copies). A command
  template whose derivation reads only the action's arguments and facts no action can change (ALFWorld's
  ``go to [{r.name | receptacleatlocation(r, lend)}]``: where each receptacle stands) derives the same text
  for the same arguments all game long, so it is derived once per (template, arguments) per game; a template
  that reads anything else (a nonterminal, a fact an action changes, a free variable) is derived as before.
  The step's fact list is built once instead of once per command.
* ``lazy_replan`` — every load and reset runs the translator twice: plain (the task the engine plays) and
  optimised, only for TextWorld's planner (``replan``: the ``policy_commands`` and walkthrough infos, which
  the engine never asks for). The optimised translation and its loading into ``libdownward`` wait for the
  first ``replan`` call: ~55% of a first reset.
* ``shared_logic`` — loading a game parses its whole grammar document with TatSu (``GameLogic``), though every
  game of the wheel's grammar differs only in its ``task`` rule (the task's text). The rest is parsed once
  (per process; with a ``disk_cache``, once for every process: kept as JSON, each symbol by its class and
  constructor arguments, written only when it reads back equal to the parse) and each game parses only its
  task rule.
* ``one_first_state`` — ``PddlEnv.load`` builds the game's initial state (to name its entities) and the
  reset that follows builds it again (the task loaded into ``libdownward`` again, the initial facts made
  again); the first reset after a load plays on the state the load built.
* ``translation_cache`` — the plain translation of a game (its SAS text, ~0.3 s of CPU for a real ALFWorld
  room) is kept on disk (``AlfredEngine(disk_cache=...)``: compressed, checksummed, named by the hash of the
  domain, the problem and the translator's version), so a process that meets a game another process (or an
  earlier run) translated reads it instead; the parsed task it goes with is parsed again (a few ms). A
  missing or damaged file is translated again; a cache that cannot be written is read only.

Each ``PddlEnv`` loads a copy of ``libdownward`` of its own (``fast_downward.load_lib``: its planner state is
global to the library) that TextWorld never unloads, some 2 MiB a copy: a closed engine hands its ``PddlEnv``
to the next engine of the process (:data:`_IDLE_PDDL_ENVS`), so a process holds as many copies as it ever had
engines open at once, not one per engine it ever made (an env server whose sessions come and go: an ALFWorld
OpenEnv worker grew from 81 to 544 MiB over 200 sessions of one env each; ``scripts/serving_probe.py``). An
idle copy frees its planner task and keeps its code out of the resident set until it is reused
(:func:`_give_back_pddl_env`). It cannot be unloaded: the copies share one registry of the planner's plugins
(a C++ function-local static, which the dynamic loader binds once for all the copies), and unloading a copy
leaves entries in it whose code is gone, so the next copy's load crashes as it copies them.

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
import ctypes
import dataclasses
import functools
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import threading
import zlib
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fast_downward
import mementos.core
import textworld
import textworld.envs.pddl.logic as pddl_logic
import textworld.envs.pddl.textgen as textgen
import xxhash
from textworld.envs.pddl import PddlEnv
from textworld.logic import Proposition, Rule, TypeHierarchy, Variable
from textworld.utils import check_flag

from progpo_base.glibc import release_library_pages

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
    #: Copy grammar parse trees (and cached query rules) structurally rather than with ``copy.deepcopy``.
    tree_copy: bool = True
    #: Derive a command template that reads only its arguments and static facts once per game and arguments.
    command_cache: bool = True
    #: Translate for TextWorld's planner (``replan``) only when it is called.
    lazy_replan: bool = True
    #: Parse the grammar document once per process; per game only its ``task`` rule.
    shared_logic: bool = True
    #: Keep plain translations on disk (where the engine is given a ``disk_cache`` folder).
    translation_cache: bool = True
    #: Play the first reset of a loaded game on the state its load built (not a second one).
    one_first_state: bool = True

    @classmethod
    def stock(cls) -> EnginePatches:
        """No fix: the engine exactly as TextWorld ships it."""
        return cls(**{field.name: False for field in dataclasses.fields(cls)})


# --- the patches --------------------------------------------------------------------------------------------

_ACTIVE: contextvars.ContextVar[EnginePatches] = contextvars.ContextVar(
    "alfworld_engine_patches",
    default=EnginePatches.stock(),  # noqa: B039  (a frozen dataclass)
)
#: The disk cache folder of the engine calling into TextWorld (``None``: none).
_DISK_CACHE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "alfworld_engine_disk_cache", default=None
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
SHARED_GAMES_CAPACITY = 64
_SHARED_GAMES = _LRU(SHARED_GAMES_CAPACITY)
#: Game logics parsed once per (domain, grammar without its task text) (``shared_logic``).
_SHARED_LOGICS = _LRU(16)


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
    """``env`` idle, without its last game (the loaded games live on in the caches), for the next engine.

    Its ``libdownward`` copy keeps only what no one can free: the planner's task and search state are freed
    (``cleanup``: every use starts with ``load_sas``, which makes them again) and the copy's code and
    constants leave the resident set until the next engine runs them (:func:`release_library_pages`). An
    idle copy then holds ~0.5 MiB instead of ~2: a worker that hosted a failed server's instances for a
    while keeps little of them once they move back. It costs a close ~20 ms (reading ``/proc/self/smaps`` of a
    process with 30 copies), once per session, never per step."""
    for name in ("_pddl_state", "state", "prev_state", "_game_data", "_game_file", "_logic", "_entity_infos"):
        setattr(env, name, None)
    env.walkthrough = None
    env.downward_lib.cleanup()
    release_library_pages(ctypes.cast(env.downward_lib.load_sas, ctypes.c_void_p).value)
    with _IDLE_LOCK:
        _IDLE_PDDL_ENVS.append(env)


def clear_caches() -> None:
    """Forget every memoised parse and translation of the process (tests and benchmarks measure cold starts
    with it); translations kept on disk stay."""
    for cache in (_TEXTGEN_PARSES, _QUERY_PARSES, _PDDL2SAS_RESULTS, _SHARED_GAMES, _SHARED_LOGICS):
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
    return _tree_copy(parsed)


def _cached_conjunctive_query(original, expr: str) -> Rule:
    if not _ACTIVE.get().grammar_cache:
        return original(expr)
    rule = _QUERY_PARSES.get(expr)
    if rule is _MISSING:
        rule = original(expr)
        _QUERY_PARSES.put(expr, rule)
    if not _ACTIVE.get().tree_copy:
        return copy.deepcopy(rule)
    # a rule's conditions are tuples of propositions (values nobody changes): the copy shares them
    copied = copy.copy(rule)
    copied._cache = copy.deepcopy(rule._cache)
    return copied


#: Exact types ``copy.deepcopy`` returns as they are.
_ATOMS = frozenset({str, int, float, bool, type(None)})
#: The classes of TextWorld's grammar parse trees (``tree_copy`` copies them itself).
_SYMBOL_CLASSES = frozenset(
    {
        textgen.TerminalSymbol,
        textgen.NonterminalSymbol,
        textgen.EvalSymbol,
        textgen.ListSymbol,
        textgen.ConditionalSymbol,
    }
)


def _copy_tree(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` of a parse tree (lists of symbols), object for object, memo and all, without
    ``deepcopy``'s generic dispatch for the lists and symbols it is made of; anything else goes to
    ``copy.deepcopy`` with the same memo."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    if kind is list:
        copied: Any = []
        memo[id(value)] = copied
        copied.extend(_copy_tree(item, memo) for item in value)
    elif kind in _SYMBOL_CLASSES:
        copied = object.__new__(kind)
        memo[id(value)] = copied
        copied.__dict__.update({key: _copy_tree(item, memo) for key, item in value.__dict__.items()})
    else:
        return copy.deepcopy(value, memo)
    memo.setdefault(id(memo), []).append(value)  # as deepcopy does: the originals outlive the copy's memo
    return copied


def _tree_copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A deep copy of ``value``: :func:`_copy_tree` under ``tree_copy``, else ``copy.deepcopy``."""
    if _ACTIVE.get().tree_copy:
        return _copy_tree(value, {} if memo is None else memo)
    return copy.deepcopy(value, memo)


def _patched_pddl2sas(original, domain: str, problem: str, verbose: bool = False, optimize: bool = False):
    patches = _ACTIVE.get()
    cacheable = patches.pddl2sas_cache and not verbose
    key = (domain, problem, bool(optimize))
    if cacheable:
        result = _PDDL2SAS_RESULTS.get(key)
        if result is not _MISSING:
            return result
    folder = _DISK_CACHE.get() if patches.translation_cache and not (verbose or optimize) else None
    result = read_translation(folder, domain, problem) if folder is not None else None
    if result is None:
        saved_argv = list(sys.argv)
        try:
            result = original(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            if patches.restore_argv:
                sys.argv[:] = saved_argv
        if folder is not None:
            write_translation(folder, domain, problem, result[1])
    if cacheable:
        _PDDL2SAS_RESULTS.put(key, result)
    return result


# --- translations on disk (``translation_cache``) ---------------------------------------------------------

#: Bumped when the file format changes.
_TRANSLATION_FORMAT = b"progpo-sas-1"


@functools.cache
def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cache_digest(file_format: bytes, package: str, *texts: str) -> str:
    """What names a file kept on disk: its format, the version of the package whose output it holds and the
    texts that output was made from."""
    hasher = xxhash.xxh3_128()
    for part in (file_format, _package_version(package).encode(), *(text.encode() for text in texts)):
        hasher.update(part)
        hasher.update(b"\0")
    return hasher.hexdigest()


def translation_path(folder: Path, domain: str, problem: str) -> Path:
    """Where the plain translation of (``domain``, ``problem``) is kept in ``folder``."""
    digest = _cache_digest(_TRANSLATION_FORMAT, "fast-downward-textworld", domain, problem)
    return Path(folder) / f"{digest}.sas.z"


def _parse_task(domain: str, problem: str) -> Any:
    """The parsed and normalised PDDL task of a translation (what ``pddl2sas`` returns beside the SAS text):
    the translator's own parser and normaliser, their warnings kept quiet as ``pddl2sas`` keeps them."""
    saved_argv = list(sys.argv)
    sys.argv = ["translate.py", "domain", "task"]  # the translator's options module parses it on import
    try:
        from fast_downward.interface import CapturingStdout
        from fast_downward.translate import normalize
        from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions

        with CapturingStdout():
            domain_pddl = lisp_parser.parse_nested_list(domain.split("\n"))
            problem_pddl = lisp_parser.parse_nested_list(problem.split("\n"))
            task = parsing_functions.parse_task(domain_pddl, problem_pddl)
            normalize.normalize(task)
    finally:
        sys.argv[:] = saved_argv
    return task


def read_translation(folder: Path, domain: str, problem: str) -> tuple[Any, str] | None:
    """The kept plain translation ``(task, sas)`` of (``domain``, ``problem``), or ``None`` when there is none
    or its file is damaged (its checksum does not match)."""
    data = _read_blob(translation_path(folder, domain, problem), _TRANSLATION_FORMAT)
    if data is None:
        return None
    try:
        sas = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return _parse_task(domain, problem), sas


def write_translation(folder: Path, domain: str, problem: str, sas: str) -> None:
    """Keep a plain translation (:func:`_write_blob`)."""
    _write_blob(translation_path(folder, domain, problem), _TRANSLATION_FORMAT, sas.encode("utf-8"))


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


# --- lazy_replan ------------------------------------------------------------------------------------------


class _LazyReplanState(pddl_logic.PddlState):
    """TextWorld's ``PddlState``, whose planner task (the optimised translation, loaded for ``replan``) is
    made on the first ``replan`` call under ``lazy_replan`` (as the stock class otherwise: every load and
    reset)."""

    def __init__(self, downward_lib, pddl_problem: str, logic):
        if not _ACTIVE.get().lazy_replan:
            super().__init__(downward_lib, pddl_problem, logic)
            return
        # TextWorld 1.7's PddlState.__init__, without the optimised translation and its load_sas_replan
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self._replan_verbose = check_flag("TW_PDDL_DEBUG")
        self.task, self.sas = fast_downward.pddl2sas(logic.domain, pddl_problem, verbose=self._replan_verbose)
        self._actions = {a.name: a for a in self.task.actions}
        for type_ in self.task.types:
            try:
                self._logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
            except ValueError:
                pass
        self.downward_lib.load_sas(self.sas.encode("utf-8"))
        self.name2type = {o.name: o.type_name for o in self.task.objects}

        def atom2proposition(atom):
            if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
                if atom.predicate == "=":
                    return None
                return Proposition(atom.predicate, [Variable(arg, self.name2type[arg]) for arg in atom.args])
            elif isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
                if atom.fluent.symbol == "total-cost":
                    return None
                name = f"{atom.expression.value}"
                if str.isdigit(name):  # discard distance relations
                    return None
                return Proposition(name, [Variable(arg, self.name2type[arg]) for arg in atom.fluent.args])

        self.add_facts(list(filter(None, (atom2proposition(atom) for atom in self.task.init))))
        atoms = (pddl_logic.Atom * self.downward_lib.get_state_size())()
        self.downward_lib.get_state(atoms)
        facts = [atom.get_fact(self.name2type) for atom in atoms]
        self.add_facts([fact for fact in facts if not fact.is_negation])

    @property
    def sas_replan(self) -> str:
        """The optimised translation (made now if it was deferred)."""
        if "_sas_replan" not in self.__dict__:
            _, self._sas_replan = fast_downward.pddl2sas(
                self._logic.domain, self.pddl_problem, verbose=self._replan_verbose, optimize=True
            )
            self.downward_lib.load_sas_replan(self._sas_replan.encode("utf-8"))
        return self._sas_replan

    @sas_replan.setter
    def sas_replan(self, value: str) -> None:  # the stock __init__ sets it (and loads it itself)
        self._sas_replan = value

    def replan(self, infos):
        self.sas_replan  # noqa: B018 - the planner's task, made and loaded on first use
        return super().replan(infos)


# --- command_cache ----------------------------------------------------------------------------------------

#: An eval symbol that reads attributes of the derivation's variables and nothing else (``{r.name}``).
_ATTRIBUTE_EXPRESSION = re.compile(r"\s*[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\s*")


def _static_predicates(task: Any) -> frozenset[str] | None:
    """The predicates of ``task`` whose facts no action or axiom changes (``None``: unknown)."""
    try:
        changed = {effect.literal.predicate for action in task.actions for effect in action.effects}
        changed |= {axiom.name for axiom in task.axioms}
        return frozenset(p.name for p in task.predicates) - changed - {"="}
    except AttributeError:
        return None


@dataclasses.dataclass(frozen=True)
class _Reads:
    """What deriving a command template reads: variables by name, and the placeholders of its queries."""

    names: frozenset[str]
    queried: frozenset[Any]


def _reads(symbols: list, static: frozenset[str]) -> _Reads | None:
    """What deriving ``symbols`` reads when it reads nothing but variables and facts of ``static``
    predicates; ``None`` when it may read anything else: a nonterminal (a grammar rule, with its
    conditions), a query of another predicate or with a placeholder no condition binds, another
    expression."""
    names: set[str] = set()
    queried: set[Any] = set()
    for symbol in symbols:
        inner: _Reads | None = _Reads(frozenset(), frozenset())
        if isinstance(symbol, textgen.TerminalSymbol):
            continue
        if isinstance(symbol, textgen.EvalSymbol):
            if not _ATTRIBUTE_EXPRESSION.fullmatch(symbol.expression):
                return None
            names.add(symbol.expression.strip().split(".")[0])
        elif isinstance(symbol, textgen.ListSymbol):
            inner = _reads([symbol.symbol], static)
        elif isinstance(symbol, textgen.ConditionalSymbol):
            if symbol.given:
                rule = Rule.parse_conjunctive_query(symbol.given)
                bound = {ph for pred in rule.preconditions for ph in pred.parameters}
                if any(p.name not in static for p in rule.preconditions) or set(rule.placeholders) - bound:
                    return None
                queried |= set(rule.placeholders)
                names |= {ph.name for ph in rule.placeholders}
            inner = _reads([symbol.expression], static)
        else:  # a nonterminal, or a symbol this check does not know
            return None
        if inner is None:
            return None
        names |= inner.names
        queried |= inner.queried
    return _Reads(frozenset(names), frozenset(queried))


class _CommandTexts:
    """One game's derived command texts (``command_cache``): what each template reads (``None``: it is not
    kept), and the text per (template, the values it reads).

    The key holds the arguments the template reads by name. A query whose placeholders the arguments all
    bind depends on nothing else (facts of static predicates about them); one with a placeholder left for
    the facts to bind also depends on which variables the arguments use (a query never binds a variable the
    mapping already uses), so its key holds every argument.
    """

    def __init__(self, static: frozenset[str] | None):
        self.static = static
        self.reads: dict[str, _Reads | None] = {}
        self.texts: dict[tuple, str] = {}

    def key(self, template: str, mapping: Mapping) -> tuple | None:
        if template in self.reads:
            reads = self.reads[template]
        else:
            reads = None
            if self.static is not None:
                reads = _reads(textgen._parse_and_convert(template, rule_name="symbols"), self.static)
            self.reads[template] = reads
        if reads is None:
            return None
        every = not reads.queried.issubset(mapping)
        return (
            template,
            *(
                (ph.name, ph.type, var.name, var.type)
                for ph, var in mapping.items()
                if every or ph.name in reads.names
            ),
        )


def _cached_gather_infos(env: PddlEnv) -> None:
    """TextWorld 1.7's ``PddlEnv._gather_infos`` with the command texts of ``command_cache``."""
    state = env._pddl_state
    env.state["command_templates"] = sorted(set(action.template for action in env._logic.actions.values()))
    env.state["won"] = state.check_goal()
    env.state["lost"] = False
    env.state["_entity_infos"] = dict(env._entity_infos)
    facts = list(state.facts)
    env.state["_facts"] = list(facts)
    if env.request_infos.facts:
        env.state["facts"] = list(map(env._get_human_readable_fact, env.state["_facts"]))
    env.state["last_action"] = None
    env.state["_last_action"] = env._last_action
    env.state["_valid_actions"] = list(state.all_applicable_actions())
    texts = env._logic.__dict__.get("_progpo_command_texts")
    if texts is None:  # one per game logic (every engine playing the game shares it)
        texts = env._logic._progpo_command_texts = _CommandTexts(_static_predicates(state.task))
    mapping = {k: info.name for k, info in env._entity_infos.items()}
    env.state["_valid_commands"] = []
    for action in env.state["_valid_actions"]:
        key = texts.key(action.command_template, action.mapping)
        text = texts.texts.get(key) if key is not None else None
        if text is None:
            context = {
                "state": state,
                "facts": facts,  # read only by the derivation: one list for every command of the step
                "variables": {ph.name: env._entity_infos[var.name] for ph, var in action.mapping.items()},
                "mapping": action.mapping,
                "entity_infos": env._entity_infos,
            }
            text = env._logic.grammar.derive(action.command_template, context)
            if key is not None:
                texts.texts[key] = text
        action.command_template = text
        env.state["_valid_commands"].append(action.format_command(mapping))
    env.state["admissible_commands"] = sorted(set(env.state["_valid_commands"]))
    if env.request_infos.moves:
        env.state["moves"] = env._moves
    if env.request_infos.policy_commands:
        env.state["policy_commands"] = state.replan(env._entity_infos)


# --- one_first_state --------------------------------------------------------------------------------------


def reset_from_loaded_state(env: PddlEnv) -> Any:
    """TextWorld 1.7's ``PddlEnv.reset`` on the initial state its ``load`` has just built
    (``one_first_state``: the stock reset builds a second one, translating and loading the task again)."""
    from textworld.core import GameState

    env.prev_state = None
    env.state = GameState()
    env._last_action = None
    env._moves = 0
    state = env._pddl_state
    context = {
        "state": state,
        "facts": list(state.facts),
        "variables": {},
        "mapping": {},
        "entity_infos": env._entity_infos,
    }
    env.state.feedback = env._logic.grammar.derive("#intro#", context)
    env.state.raw = env.state.feedback
    env._gather_infos()
    if "walkthrough" in env.request_infos.extras:
        env.state["extra.walkthrough"] = env.walkthrough or state.replan(env._entity_infos)
    return env.state


# --- shared_logic -----------------------------------------------------------------------------------------

#: The grammar's ``task`` rule: one rule, its text only (``"task": [{"rhs": "Your task is to: ..."}]``).
_TASK_RULE = re.compile(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"((?:[^"\\\n]|\\.)*)"\s*\}\s*\]')
#: What stands for the task's text in the grammar parsed once.
_TASK_PLACEHOLDER = "UNKNOWN GOAL"


#: Bumped when the logic file format changes.
_LOGIC_FORMAT = b"progpo-logic-1"


def _tree_data(value: Any) -> Any:
    """A grammar parse tree as JSON data (each symbol by its class and constructor arguments)."""
    kind = type(value)
    if kind is list:
        return [_tree_data(item) for item in value]
    if kind is str:
        return ["s", value]
    if kind is textgen.TerminalSymbol:
        return ["t", value.symbol]
    if kind is textgen.NonterminalSymbol:
        return ["n", value.symbol]
    if kind is textgen.EvalSymbol:
        return ["e", value.expression]
    if kind is textgen.ListSymbol:
        return ["l", _tree_data(value.symbol)]
    if kind is textgen.ConditionalSymbol:
        return ["c", _tree_data(value.expression), value.given]
    raise TypeError(f"no JSON form for {kind.__name__}")


def _tree(data: Any) -> Any:
    """The parse tree of :func:`_tree_data`, built with the classes' constructors as the parser builds it."""
    if not data or type(data[0]) is not str:  # a list of symbols (a tag is a string)
        return [_tree(item) for item in data]
    tag, *args = data
    if tag == "s":
        return args[0]
    if tag == "t":
        return textgen.TerminalSymbol(args[0])
    if tag == "n":
        return textgen.NonterminalSymbol(args[0])
    if tag == "e":
        return textgen.EvalSymbol(args[0])
    if tag == "l":
        return textgen.ListSymbol(_tree(args[0]))
    if tag == "c":
        return textgen.ConditionalSymbol(_tree(args[0]), args[1])
    raise ValueError(f"unknown symbol tag {tag!r}")


def _logic_data(logic: Any) -> dict[str, Any]:
    actions = [
        {
            "key": key,
            "name": a.name,
            "template": a.template,
            "pddl": a.pddl,
            "grammar": a.grammar,
            "feedback_rule": a.feedback_rule,
        }
        for key, a in logic.actions.items()
    ]
    rules = {
        name: [[r.lhs, _tree_data(r.rhs), r.weight, r.condition] for r in rule_list]
        for name, rule_list in logic.grammar._rules.items()
    }
    return {"domain": logic.domain, "actions": actions, "rules": rules}


def _logic(data: dict[str, Any]) -> Any:
    logic = pddl_logic.GameLogic.__new__(pddl_logic.GameLogic)
    logic.domain = data["domain"]
    logic.actions = {
        a["key"]: pddl_logic.Action(a["name"], a["template"], a["pddl"], a["grammar"], a["feedback_rule"])
        for a in data["actions"]
    }
    logic.types = TypeHierarchy()
    logic.grammar = textgen.ContextSensitiveGrammar()
    for name, rule_list in data["rules"].items():
        for lhs, rhs, weight, condition in rule_list:
            logic.grammar.add_rule(
                textgen.ProductionRule(lhs=lhs, rhs=_tree(rhs), weight=weight, condition=condition)
            )
        if not rule_list:
            logic.grammar._rules[name]  # noqa: B018 - an empty rule list stays a key, as parsed
    return logic


def _render(logic: Any) -> Any:
    """What a logic is made of, comparable (to check a logic read from disk against its parse)."""
    return (
        logic.domain,
        [(k, vars(a)) for k, a in logic.actions.items()],
        [
            (k, [(r.lhs, repr(r.rhs), r.weight, r.condition) for r in v])
            for k, v in logic.grammar._rules.items()
        ],
    )


def _logic_path(folder: Path, domain: str, template: str) -> Path:
    return Path(folder) / f"logic-{_cache_digest(_LOGIC_FORMAT, 'textworld', domain, template)}.json.z"


def _read_blob(path: Path, magic: bytes) -> bytes | None:
    """The body of a file :func:`_write_blob` wrote, or ``None`` (missing, damaged, another format)."""
    try:
        blob = path.read_bytes()
        header, _, body = blob.partition(b"\n")
        found, _, checksum = header.partition(b" ")
        if found != magic or checksum.decode() != xxhash.xxh3_64_hexdigest(body):
            return None
        return zlib.decompress(body)
    except (OSError, ValueError, zlib.error):
        return None


def _write_blob(path: Path, magic: bytes, data: bytes) -> None:
    """Write ``data`` compressed, with its checksum, atomically (a reader never sees half a file); a folder
    that cannot be written (read-only, full) is left as it is."""
    body = zlib.compress(data, 6)
    blob = magic + b" " + xxhash.xxh3_64_hexdigest(body).encode() + b"\n" + body
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(blob)
        os.replace(tmp_name, path)
    except OSError:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)


def _base_logic(domain: str, template: str) -> Any:
    """The logic of the grammar template, parsed once per process, or read from the disk cache (where the
    first process that parsed it kept it, checked against the parse before it was written)."""
    key = (domain, template)
    base = _SHARED_LOGICS.get(key)
    if base is not _MISSING:
        return base
    folder = _DISK_CACHE.get()
    path = _logic_path(folder, domain, template) if folder is not None else None
    data = _read_blob(path, _LOGIC_FORMAT) if path is not None else None
    base = None
    if data is not None:
        try:
            base = _logic(json.loads(data))
        except (ValueError, KeyError, TypeError, IndexError):
            base = None
    if base is None:
        base = pddl_logic.GameLogic(domain=domain, grammar=template)
        if path is not None:
            try:
                text = json.dumps(_logic_data(base), separators=(",", ":"))
                if _render(_logic(json.loads(text))) == _render(base):  # only a faithful copy is kept
                    _write_blob(path, _LOGIC_FORMAT, text.encode("utf-8"))
            except TypeError:  # a symbol without a JSON form: parsed in every process
                pass
    _SHARED_LOGICS.put(key, base)
    return base


def game_logic(domain: str, grammar: str) -> Any:
    """The ``GameLogic`` of a game (``shared_logic``): the grammar document without the text of its one
    ``task`` rule is parsed once per process and shared (actions, the other rules), the game's ``task`` rule
    is parsed alone, the types start empty as in a fresh ``GameLogic``. A grammar without exactly one plain
    ``task`` rule is parsed whole, as the stock engine does."""
    matches = list(_TASK_RULE.finditer(grammar))
    if len(matches) != 1 or grammar.count('"task"') != 1:
        return pddl_logic.GameLogic(domain=domain, grammar=grammar)
    match = matches[0]
    template = grammar[: match.start(1)] + _TASK_PLACEHOLDER + grammar[match.end(1) :]
    base = _base_logic(domain, template)
    task = json.loads(f'"{match.group(1)}"')
    logic = pddl_logic.GameLogic.__new__(pddl_logic.GameLogic)
    logic.domain = domain
    logic.actions = base.actions  # read only while playing
    logic.types = TypeHierarchy()  # filled by each state, as for a fresh GameLogic
    logic.grammar = textgen.ContextSensitiveGrammar()
    logic.grammar.update(base.grammar)  # fresh rule lists holding the shared (read-only) rules
    logic.grammar._rules["task"] = textgen.ContextSensitiveGrammar.parse(
        json.dumps({"task": [{"rhs": task}]})
    )._rules["task"]
    return logic


#: Entries of TextWorld's table of interned propositions past which the table starts again empty: a game
#: brings ~150 of its own on average (480 generated games: 69,052), so the table holds the last few hundred
#: games' (the 64 of the shared game cache among them).
INTERN_TABLE_CAPACITY = 50_000


class _InternTable(dict):
    """``mementos``' table of the instances TextWorld interns (every ``Proposition`` and ``Signature`` made,
    keyed by its value: equal calls return one instance), emptied when it reaches :attr:`capacity` entries.

    Stock, the table keeps every proposition of every game a process ever met, so a worker that meets new
    games one after another never stops growing: 480 generated games met one after another left 69,052
    entries and the process at 181.9 MiB; bounded, 45,413 entries and 168.2 MiB (``scripts/serving_probe.py
    games``), and a real split has 3,553 games. Interning only spares memory and time for equal values;
    propositions and signatures compare and hash by value, so one made after the table emptied is equal to
    one made before, and the engine plays the same transcript
    (``tests/progpo_envs/alfworld/test_alfworld_engine.py``)."""

    def __init__(self, entries: Mapping, capacity: int):
        super().__init__(entries)
        self.capacity = capacity

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.capacity:
            self.clear()
        super().__setitem__(key, value)


def interned_propositions() -> int:
    """The entries of TextWorld's table of interned propositions and signatures (:class:`_InternTable`)."""
    return len(mementos.core._memento_cache)


@functools.cache
def install_patches() -> None:
    """Wrap the patched engine functions once per process; they obey the active :class:`EnginePatches`
    (:func:`active_patches` calls it; a benchmark that times the patched functions calls it first). And
    bound TextWorld's table of interned propositions (:class:`_InternTable`), whatever the patches: it is the
    process's, not an engine's."""
    mementos.core._memento_cache = _InternTable(mementos.core._memento_cache, INTERN_TABLE_CAPACITY)

    original_parse = textgen._parse_and_convert
    textgen._parse_and_convert = functools.wraps(original_parse)(
        functools.partial(_cached_textgen_parse, original_parse)
    )

    original_query = Rule.parse_conjunctive_query.__func__

    def parse_conjunctive_query(cls, expr: str) -> Rule:
        return _cached_conjunctive_query(functools.partial(original_query, cls), expr)

    Rule.parse_conjunctive_query = classmethod(functools.wraps(original_query)(parse_conjunctive_query))

    # ``Symbol.copy`` and ``ContextSensitiveGrammar.replace`` deep-copy parse trees through the module's name
    textgen.deepcopy = _tree_copy

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

    # ``PddlEnv.load`` and ``reset`` make their states through the module attribute.
    pddl_logic.PddlState = _LazyReplanState

    original_gather_infos = PddlEnv._gather_infos

    @functools.wraps(original_gather_infos)
    def gather_infos(self) -> None:
        if _ACTIVE.get().command_cache:
            _cached_gather_infos(self)
        else:
            original_gather_infos(self)

    PddlEnv._gather_infos = gather_infos


@contextlib.contextmanager
def active_patches(patches: EnginePatches, disk_cache: Path | None = None) -> Iterator[None]:
    """Run the enclosed engine calls with ``patches`` on (``disk_cache``: the engine's disk cache folder,
    if any)."""
    install_patches()
    token = _ACTIVE.set(patches)
    folder = _DISK_CACHE.set(disk_cache)
    try:
        yield
    finally:
        _DISK_CACHE.reset(folder)
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
        disk_cache: The folder that keeps, for every process, what the engine computes once: the plain
            translation of each game (``translation_cache``) and the parse of the grammar the games share
            (``shared_logic``); ``None``: nothing is kept on disk.
    """

    def __init__(
        self,
        patches: EnginePatches | None = None,
        max_cached_games: int = 16,
        disk_cache: str | Path | None = None,
    ):
        self.patches = patches if patches is not None else EnginePatches()
        self.max_cached_games = max_cached_games
        self.disk_cache = Path(disk_cache) if disk_cache is not None else None
        with self._patched():
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
        with self._patched():
            if self._env is None:  # reset after close: the engine takes a PddlEnv again
                self._env = _take_pddl_env()
            fresh = False  # whether the env holds the initial state this call's load built
            loaded = self._games.get(key)
            if loaded is None:
                loaded = _SHARED_GAMES.get(key)
                if loaded is _MISSING:
                    loaded, fresh = self._load(game), True
                    _SHARED_GAMES.put(key, loaded)
                self._games[key] = loaded
                while len(self._games) > self.max_cached_games:
                    self._games.popitem(last=False)
            self._games.move_to_end(key)
            self._install(loaded)
            self._game_key = key
            if fresh and self.patches.one_first_state:
                self._state = reset_from_loaded_state(self._env)
            else:
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
        with self._patched():
            self._state, _, _ = self._env.step(command)
        self._feedback = self._state.feedback
        return self._feedback

    def _patched(self):
        return active_patches(self.patches, self.disk_cache)

    def _load(self, game: str | Path | Mapping[str, Any]) -> _LoadedGame:
        """``PddlEnv.load`` followed by ALFWorld's demangling (what ``AlfredDemangler.load`` does)."""
        if self.patches.shared_logic:
            self._load_shared(str(game) if isinstance(game, Path) else game)
        else:
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

    def _load_shared(self, game: str | Mapping[str, Any]) -> None:
        """TextWorld 1.7's ``PddlEnv.load`` with the game logic of :func:`game_logic` (``shared_logic``)."""
        env = self._env
        if isinstance(game, Mapping):
            data, env._game_file = game, None
        else:
            data, env._game_file = load_game_data(game), game
        env._game_data = data
        env.walkthrough = data.get("walkthrough", None)
        env._logic = game_logic(data["pddl_domain"], data["grammar"])
        env._pddl_state = pddl_logic.PddlState(env.downward_lib, data["pddl_problem"], env._logic)
        env._entity_infos = env._get_entity_infos()

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
