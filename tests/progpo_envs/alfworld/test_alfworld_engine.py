"""The engine wrapper and its three fixes: each leaves the transcript byte-identical to the stock engine."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import hashlib
import random
import sys
from pathlib import Path

import mementos.core
import pytest
import textworld
import textworld.envs.pddl.textgen as textgen
from textworld.envs.pddl import PddlEnv
from textworld.logic import Rule

from progpo_envs.alfworld import wheel
from progpo_envs.alfworld.data import load_tasks
from progpo_envs.alfworld.engine import (
    INTERN_TABLE_CAPACITY,
    NOTHING_HAPPENS,
    AlfredEngine,
    EnginePatches,
    clear_caches,
    demangled_names,
    install_patches,
)
from progpo_envs.alfworld.task_types import TASK_TYPES

PATCH_SETS = {
    "stock": EnginePatches.stock(),
    **{
        name: dataclasses.replace(EnginePatches.stock(), **{name: True})
        for name in (
            "grammar_cache",
            "pddl2sas_cache",
            "restore_argv",
            "shallow_context_copy",
            "tree_copy",
            "command_cache",
            "lazy_replan",
            "shared_logic",
            "one_first_state",
        )
    },
    "all": EnginePatches(),
}
#: Steps per episode of a transcript (the stock engine needs up to ~0.4 s per step on real games).
NUM_STEPS = 6


def play_transcript(reset, step, admissible, rng_seed: int = 0) -> list[str]:
    """Two episodes of a game (the second exercises the caches): obs + admissible commands after each step.

    Actions are drawn from the admissible commands by a seeded generator, with an inadmissible command mixed
    in, so identical transcripts mean identical choices all along.
    """
    rng = random.Random(rng_seed)
    transcript = []
    for _ in range(2):
        transcript.append(reset())
        transcript.append("\n".join(admissible()))
        for t in range(NUM_STEPS):
            command = "jump over the moon" if t == 3 else rng.choice([c for c in admissible() if c != "help"])
            transcript.append(f"> {command}")
            transcript.append(step(command))
            transcript.append("\n".join(admissible()))
    return transcript


def engine_transcript(game_file, patches: EnginePatches) -> list[str]:
    clear_caches()
    engine = AlfredEngine(patches)
    return play_transcript(lambda: engine.reset(game_file), engine.step, lambda: engine.admissible_commands)


def alfworld_transcript(game_file) -> list[str]:
    """The same episode through ALFWorld's own wrappers (``AlfredDemangler`` over a stock ``PddlEnv``)."""
    clear_caches()
    tw_env = wheel.import_alfworld("alfworld.agents.environment.alfred_tw_env")
    env = tw_env.AlfredDemangler(
        PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True)), shuffle=False
    )
    state = {}

    def reset():
        env.load(str(game_file))  # textworld.gym reloads the game on every reset
        state["s"] = env.reset()
        return state["s"].feedback

    def step(command):
        state["s"], _, _ = env.step(command)
        return state["s"].feedback

    saved_argv = list(sys.argv)
    try:
        return play_transcript(reset, step, lambda: state["s"]["admissible_commands"])
    finally:
        sys.argv[:] = saved_argv


def digest(transcript: list[str]) -> str:
    return hashlib.sha256("\0".join(transcript).encode()).hexdigest()


@pytest.fixture(scope="module")
def games(shared_alfworld_data, generated_root, progpo_cache) -> dict[str, object]:
    """The smallest real (rebuilt) game and a generated heat game: the stock engine is slow on big rooms."""
    real = min(
        load_tasks("valid_seen", shared_alfworld_data),
        key=lambda t: (t.trial_dir / "initial_state.pddl").stat().st_size,
    )
    generated = load_tasks("train", generated_root)
    return {
        "real": real.game_file(),
        "generated": next(t for t in generated if t.task_type == "pick_heat_then_place_in_recep").game_file(),
    }


@pytest.fixture(scope="module")
def reference(games):
    """ALFWorld's own transcript of a game, computed once per game."""
    transcripts: dict[str, list[str]] = {}

    def get(name: str) -> list[str]:
        if name not in transcripts:
            transcripts[name] = alfworld_transcript(games[name])
        return transcripts[name]

    return get


@pytest.fixture
def game_files(games):
    return list(games.values())


@pytest.mark.parametrize("game", ["generated", pytest.param("real", marks=pytest.mark.slow)])
def test_stock_engine_matches_alfworlds_own_wrappers(game, games, reference):
    ours = engine_transcript(games[game], EnginePatches.stock())
    assert ours == reference(game)
    assert NOTHING_HAPPENS in ours


@pytest.mark.parametrize("name", [n for n in PATCH_SETS if n != "stock"])
def test_each_patch_keeps_the_transcript_byte_identical(name, games, reference):
    assert digest(engine_transcript(games["generated"], PATCH_SETS[name])) == digest(reference("generated"))


def test_all_patches_keep_a_real_game_byte_identical(games, reference):
    assert digest(engine_transcript(games["real"], EnginePatches())) == digest(reference("real"))


def test_interned_propositions_are_bounded_and_play_the_same(games, reference, monkeypatch):
    """TextWorld interns every proposition of every game a process meets, forever. The table is bounded;
    emptied many times over an episode, the stock engine and the patched one still play ALFWorld's
    transcript."""
    install_patches()
    table = mementos.core._memento_cache
    assert table.capacity == INTERN_TABLE_CAPACITY
    monkeypatch.setattr(table, "capacity", 40)  # a game makes a few hundred
    emptied = []  # the table's size at each emptying

    def clear() -> None:
        emptied.append(len(table))
        dict.clear(table)

    monkeypatch.setattr(table, "clear", clear, raising=False)
    for patches in (EnginePatches.stock(), EnginePatches()):
        dict.clear(table)  # what earlier tests interned would be found, not made again
        emptied.clear()
        assert engine_transcript(games["generated"], patches) == reference("generated")
        assert len(emptied) >= 5 and max(emptied) == 40


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PATCH_SETS if n not in {"stock", "all"}])
def test_each_patch_keeps_a_real_game_byte_identical(name, games, reference):
    assert digest(engine_transcript(games["real"], PATCH_SETS[name])) == digest(reference("real"))


def test_restore_argv_fixes_the_clobbering(games):
    path = games["generated"]
    saved = list(sys.argv)
    try:
        sys.argv[:] = ["my-script", "--flag"]
        clear_caches()
        AlfredEngine(EnginePatches()).reset(path)
        assert sys.argv == ["my-script", "--flag"]
        clear_caches()
        AlfredEngine(EnginePatches.stock()).reset(path)
        assert sys.argv == ["translate.py", "domain", "task"]  # the upstream bug the patch fixes
    finally:
        sys.argv[:] = saved


def test_pddl2sas_cache_translates_each_game_once(games, monkeypatch):
    path = games["generated"]
    AlfredEngine().reset(path)  # imports the translator (its options module parses sys.argv on import)
    fd_translate = sys.modules["fast_downward.translate.translate"]
    calls = []
    original = fd_translate.pddl_to_sas
    monkeypatch.setattr(fd_translate, "pddl_to_sas", lambda task: calls.append(1) or original(task))
    clear_caches()
    engine = AlfredEngine(EnginePatches())
    engine.reset(path)
    first = len(calls)
    assert first == 1  # plain only (lazy_replan); the stock engine's load() and reset() would make it 4
    engine.reset(path)
    AlfredEngine(EnginePatches()).reset(path)  # another engine in the process shares the cache
    assert len(calls) == first
    clear_caches()  # forget the shared loaded game: the stock engine loads (2 translations) and resets (2)
    stock = AlfredEngine(EnginePatches.stock())
    stock.reset(path)
    assert len(calls) == first + 4


def test_grammar_cache_hands_out_independent_copies():
    with_cache = EnginePatches()
    from progpo_envs.alfworld.engine import active_patches

    with active_patches(with_cache):
        first = textgen._parse_and_convert(
            "You arrive at {r.name}. #examineReceptacle.feedback#", rule_name="symbols"
        )
        first[0].symbol = "MUTATED"
        second = textgen._parse_and_convert(
            "You arrive at {r.name}. #examineReceptacle.feedback#", rule_name="symbols"
        )
        assert second[0].symbol != "MUTATED"
        rule = Rule.parse_conjunctive_query("openable(r:receptacle) & opened(r:receptacle)")
        rule.name = "MUTATED"
        again = Rule.parse_conjunctive_query("openable(r:receptacle) & opened(r:receptacle)")
        assert again.name == "query" and len(again.preconditions) == 2
    with active_patches(EnginePatches.stock()):
        stock = textgen._parse_and_convert(
            "You arrive at {r.name}. #examineReceptacle.feedback#", rule_name="symbols"
        )
    assert [repr(s) for s in stock] == [repr(s) for s in second]


def test_demangled_names_match_alfworlds_demangler(game_files):
    misc = wheel.import_alfworld("alfworld.agents.utils.misc")
    engine = AlfredEngine()
    engine.reset(game_files[0])
    infos = {k: copy.copy(v) for k, v in engine._env._entity_infos.items()}
    demangler = misc.Demangler(game_infos=infos, shuffle=False)
    expected = {info.id: demangler.demangle_alfred_name(info.id) for info in infos.values()}
    assert demangled_names(list(expected)) == expected
    assert any(name.startswith("sinkbasin") or name.endswith(" 2") for name in expected.values())


def test_engine_exposes_the_true_state(game_files):
    engine = AlfredEngine()
    engine.reset(game_files[0])
    facts = engine.facts()
    assert any(f.name == "atlocation" and f.arguments[0].name.startswith("agent") for f in facts)
    names = set(engine.names.values())
    assert all(arg.name in names for f in facts for arg in f.arguments)
    assert len(engine.raw_facts()) == len(facts)
    assert "help" in engine.admissible_commands and not engine.won
    assert engine.game_data["pddl_domain"] == wheel.wheel_domain()


def test_engine_requires_reset_and_a_key_for_data():
    engine = AlfredEngine()
    with pytest.raises(RuntimeError):
        engine.step("look")
    with pytest.raises(ValueError, match="key"):
        engine.reset({"pddl_domain": ""})


def test_loaded_games_are_kept_per_engine_up_to_the_limit(game_files):
    engine = AlfredEngine(max_cached_games=2)
    for path in game_files:
        engine.reset(path)
    assert len(engine._games) == 2
    intro = engine.reset(game_files[-1])
    assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-")


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_all_patches_byte_identical_on_every_task_type(task_type, shared_alfworld_data, progpo_cache):
    task = next(t for t in load_tasks("valid_seen", shared_alfworld_data) if t.task_type == task_type)
    path = task.game_file()
    assert digest(engine_transcript(path, EnginePatches())) == digest(alfworld_transcript(path))


def test_engines_of_a_process_share_loaded_games_but_not_state(games, monkeypatch):
    clear_caches()
    loads = []
    original = AlfredEngine._load
    monkeypatch.setattr(AlfredEngine, "_load", lambda self, game: loads.append(game) or original(self, game))
    a, b = AlfredEngine(), AlfredEngine()
    assert a.reset(games["generated"]) == b.reset(games["generated"])
    assert len(loads) == 1
    before = b.admissible_commands
    command = next(c for c in a.admissible_commands if c.startswith("go to "))
    a.step(command)
    assert a.admissible_commands != before and b.admissible_commands == before
    assert b.step(command) == a.feedback


def _libdownward_copies() -> int:
    """The copies of ``libdownward`` this process has loaded (each from a file of its own)."""
    with open("/proc/self/maps") as maps:
        return len({line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                    for line in maps if "libdownward" in line})  # fmt: skip


def test_a_closed_engine_hands_its_libdownward_copy_to_the_next_engine(generated_root):
    """Issue 35, item 6: each engine loaded a copy of ``libdownward`` that no close unloaded, some 2 MiB, so a
    process whose envs come and go grew without end (an ALFWorld OpenEnv worker: 81 to 544 MiB over 200
    sessions). Now a closed engine's copy serves the next engine, with the same transcript."""
    path = load_tasks("train", generated_root)[0].game_file()

    def episode() -> list[str]:
        engine = AlfredEngine()
        try:
            transcript = [engine.reset(path)]
            for _ in range(3):
                command = sorted(c for c in engine.admissible_commands if c != "help")[0]
                transcript += [command, engine.step(command), "\n".join(engine.admissible_commands)]
            return transcript
        finally:
            engine.close()

    first = episode()
    before = _libdownward_copies()
    assert all(episode() == first for _ in range(8))  # a reused copy plays as a fresh one
    assert _libdownward_copies() == before
    together = [AlfredEngine(), AlfredEngine()]  # two open at once: two copies (one more, kept after)
    for engine in together:
        engine.reset(path)
        engine.close()
    assert _libdownward_copies() <= before + 1


def _resident_code_bytes(pddl_env) -> int:
    """The resident bytes of the code of ``pddl_env``'s ``libdownward`` copy."""
    address = ctypes.cast(pddl_env.downward_lib.load_sas, ctypes.c_void_p).value
    in_code = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's header
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                in_code = start <= address < end
            elif in_code and fields[0] == "Rss:":
                return int(fields[1]) * 1024
    raise LookupError(hex(address))


def test_an_idle_libdownward_copy_keeps_its_code_out_of_memory_until_reused(generated_root):
    """Issue 38: a worker that hosted a failed server's instances kept ~2 MiB for each copy they left idle
    (the soak's ALFWorld workers grew 26.9%). An idle copy's planner task is freed and its code leaves the
    resident set; the next engine runs it again and plays as a fresh one."""
    path = load_tasks("train", generated_root)[0].game_file()
    engines = [AlfredEngine() for _ in range(3)]
    for engine in engines:
        engine.reset(path)
        engine.step(sorted(c for c in engine.admissible_commands if c != "help")[0])
    pddl_envs = [engine._env for engine in engines]
    assert all(_resident_code_bytes(env) > 256 * 1024 for env in pddl_envs)
    transcript = [engines[0].feedback, engines[0].admissible_commands]
    for engine in engines:
        engine.close()
    assert all(_resident_code_bytes(env) < 64 * 1024 for env in pddl_envs)

    again = AlfredEngine()
    assert again._env in pddl_envs  # an idle copy, reused
    again.reset(path)
    again.step(sorted(c for c in again.admissible_commands if c != "help")[0])
    assert [again.feedback, again.admissible_commands] == transcript
    assert _resident_code_bytes(again._env) > 256 * 1024
    again.close()


def test_lazy_replan_plans_as_the_stock_engine_when_asked(games):
    """The planner's task is made on the first replan call: the plan from a state mid-episode is the stock
    engine's, and the episode goes on identically after it."""
    path = games["generated"]
    plans, transcripts = {}, {}
    for name, patches in (("stock", EnginePatches.stock()), ("lazy", EnginePatches())):
        clear_caches()
        engine = AlfredEngine(patches)
        transcript = [engine.reset(path)]
        command = next(c for c in engine.admissible_commands if c.startswith("go to "))
        transcript.append(engine.step(command))
        with engine._patched():
            plans[name] = engine._env._pddl_state.replan(engine._env._entity_infos)
        for command in plans[name][:3]:
            transcript.append(engine.step(command))
            transcript.append("\n".join(engine.admissible_commands))
        transcripts[name] = transcript
    assert plans["lazy"] == plans["stock"] and plans["stock"]
    assert transcripts["lazy"] == transcripts["stock"]


def test_shared_logic_is_the_logic_the_game_would_parse(games, shared_alfworld_data, progpo_cache):
    """Per game only the task rule is parsed; the logic it plays with has the same actions and rules (the
    same texts, conditions and weights) as the game's own grammar parsed whole."""
    import textworld.envs.pddl.logic as pddl_logic

    from progpo_envs.alfworld.engine import active_patches, game_logic, load_game_data

    tasks = load_tasks("valid_seen", shared_alfworld_data)[:3]
    with active_patches(EnginePatches()):
        logics = []
        for task in tasks:
            data = load_game_data(task.game_file())
            shared, whole = (
                game_logic(data["pddl_domain"], data["grammar"]),
                pddl_logic.GameLogic(data["pddl_domain"], data["grammar"]),
            )
            assert {k: vars(a) for k, a in shared.actions.items()} == {
                k: vars(a) for k, a in whole.actions.items()
            }
            render = lambda g: {  # noqa: E731
                k: [(r.lhs, repr(r.rhs), r.weight, r.condition) for r in v] for k, v in g._rules.items()
            }
            assert render(shared.grammar) == render(whole.grammar)
            assert "Your task is to: " in repr(shared.grammar._rules["task"])
            logics.append(shared)
    assert logics[0].actions is logics[1].actions  # parsed once, shared
    assert logics[0].grammar._rules["task"] is not logics[1].grammar._rules["task"]


def test_command_cache_derives_each_static_command_once_per_game(games, monkeypatch):
    """``go to`` commands (which read where receptacles stand, a fact no action changes) are derived once per
    (template, arguments) per game; the transcript is the stock one (the byte-identity tests above)."""
    derived = []
    original = textgen.ContextSensitiveGrammar.derive
    monkeypatch.setattr(
        textgen.ContextSensitiveGrammar,
        "derive",
        lambda self, start, context={}: derived.append(start) or original(self, start, context),
    )
    clear_caches()
    engine = AlfredEngine(EnginePatches())
    engine.reset(games["generated"])
    first = sum(1 for start in derived if start.startswith("go to"))
    assert first > 0
    command = next(c for c in engine.admissible_commands if c.startswith("go to "))
    engine.step(command)
    engine.reset(games["generated"])  # the same game again: every go-to command's text is known
    assert sum(1 for start in derived if start.startswith("go to")) <= first + 1
    from progpo_envs.alfworld.engine import _static_predicates

    static = _static_predicates(engine._env._pddl_state.task)
    assert "receptacleatlocation" in static and "atlocation" not in static and "holds" not in static


def _fresh_transcript(path: str, folder: Path) -> list[str]:
    """The game at ``path`` played from a fresh process state (caches cleared) by an engine that keeps its
    files on disk in ``folder``."""
    clear_caches()
    engine = AlfredEngine(EnginePatches(), disk_cache=folder)
    return play_transcript(lambda: engine.reset(path), engine.step, lambda: engine.admissible_commands)


def test_translations_kept_on_disk_replay_byte_identically(games, reference, tmp_path, monkeypatch):
    """A translation kept on disk by one engine is read (not translated again) by the next one in a fresh
    process state, and the game plays byte-identically; a damaged file is translated again, and a folder
    that cannot be written is only read."""
    path = games["generated"]
    folder = tmp_path / "translations"
    transcript = functools.partial(_fresh_transcript, path, folder)
    assert digest(transcript()) == digest(reference("generated"))
    files = list(folder.glob("*.sas.z"))
    assert len(files) == 1 and files[0].read_bytes().startswith(b"progpo-sas-1 ")
    fd_translate = sys.modules["fast_downward.translate.translate"]
    calls = []
    original = fd_translate.pddl_to_sas
    monkeypatch.setattr(fd_translate, "pddl_to_sas", lambda task: calls.append(1) or original(task))
    assert digest(transcript()) == digest(reference("generated")) and calls == []  # read from disk
    files[0].write_bytes(files[0].read_bytes()[:-10] + b"0123456789")  # damaged: checksum mismatch
    assert digest(transcript()) == digest(reference("generated")) and calls == [1]  # translated again
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    clear_caches()  # a folder that cannot be made (its parent is a file): translated, played, nothing kept
    engine = AlfredEngine(EnginePatches(), disk_cache=blocked / "translations")
    assert engine.reset(path) == reference("generated")[0]


def test_tree_copy_hands_out_independent_copies_like_deepcopy():
    from progpo_envs.alfworld.engine import active_patches

    text = "You see {r.name}. #examineReceptacle.feedback# [{o.name | inreceptacle(o:object, r:receptacle)}]"
    with active_patches(EnginePatches.stock()):
        stock = textgen._parse_and_convert(text, rule_name="symbols")
    with active_patches(EnginePatches()):
        first = textgen._parse_and_convert(text, rule_name="symbols")
        second = textgen._parse_and_convert(text, rule_name="symbols")
        copied = textgen.deepcopy(first)
    assert [repr(s) for s in first] == [repr(s) for s in stock] == [repr(s) for s in copied]
    assert all(a is not b for a, b in zip(first, second, strict=True))
    nested = [s for s in first if isinstance(s, textgen.ListSymbol)]
    assert nested and nested[0].symbol is not copied[first.index(nested[0])].symbol
    # deepcopy's sharing is kept: symbols that shared one (default) context dict share one copy of it
    pairs = list(zip([s.context for s in first], [s.context for s in copied], strict=True))
    assert all((a is b) == (c is d) for a, c in pairs for b, d in pairs)


def test_the_grammar_kept_on_disk_is_the_parse_and_plays_byte_identically(games, reference, tmp_path):
    """The shared grammar's parse is kept as JSON by the first process and read by the next (TatSu is not run
    again), equal to the parse, and the game plays as the stock engine; a damaged file is parsed again."""
    import textworld.envs.pddl.logic as pddl_logic

    from progpo_envs.alfworld import engine as engine_module

    path = games["generated"]
    folder = tmp_path / "engine"
    transcript = functools.partial(_fresh_transcript, path, folder)
    assert digest(transcript()) == digest(reference("generated"))
    kept = sorted(folder.glob("logic-*.json.z"))
    assert len(kept) == 1
    parses = []
    original = pddl_logic.GameLogic.__init__

    def counting(self, *args, **kwargs):
        parses.append(1)
        original(self, *args, **kwargs)

    pddl_logic.GameLogic.__init__ = counting
    try:
        assert digest(transcript()) == digest(reference("generated")) and parses == []  # read from disk
        data = engine_module.load_game_data(path)
        clear_caches()
        with engine_module.active_patches(EnginePatches(), folder):
            from_disk = engine_module.game_logic(data["pddl_domain"], data["grammar"])
        parsed = pddl_logic.GameLogic.__new__(pddl_logic.GameLogic)
        original(parsed, data["pddl_domain"], data["grammar"])
        assert engine_module._render(from_disk) == engine_module._render(parsed)
        kept[0].write_bytes(kept[0].read_bytes()[:-8] + b"damaged!")
        assert digest(transcript()) == digest(reference("generated")) and parses == [1]  # parsed again
    finally:
        pddl_logic.GameLogic.__init__ = original
