"""The true-state expert: plan shapes on hand-made states, real valid_seen trials, generated games."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from textworld.logic import Proposition, Variable

from progpo_envs.alfworld.data import load_tasks
from progpo_envs.alfworld.engine import AlfredEngine
from progpo_envs.alfworld.expert import ALFWorldExpert, PlaceWording, WorldState
from progpo_envs.alfworld.task_types import TASK_TYPES

MAX_STEPS = 50


def fact(name: str, *args: tuple[str, str]) -> Proposition:
    return Proposition(name, [Variable(arg, kind) for arg, kind in args])


def receptacle(name: str, location: str, kind: str, openable: bool = False) -> list[Proposition]:
    facts = [
        fact("receptacleatlocation", (name, "receptacle"), (location, "location")),
        fact("receptacletype", (name, "receptacle"), (f"{kind}type ", "rtype")),
    ]
    if openable:
        facts.append(fact("openable", (name, "receptacle")))
    return facts


def item(name: str, kind: str, container: str, *flags: str) -> list[Proposition]:
    facts = [
        fact("objecttype", (name, "object"), (f"{kind}type ", "otype")),
        fact("pickupable", (name, "object")),
        fact("inreceptacle", (name, "object"), (container, "receptacle")),
    ]
    return facts + [fact(flag, (name, "object")) for flag in flags]


def at(location: str) -> Proposition:
    return fact("atlocation", ("agent1 ", "agent"), (location, "location"))


def can(rtype: str, otype: str) -> Proposition:
    return fact("cancontain", (f"{rtype}type ", "rtype"), (f"{otype}type ", "otype"))


def kitchen() -> list[Proposition]:
    return [
        *receptacle("cabinet 1", "loc 1", "cabinet", openable=True),
        *receptacle("countertop 1", "loc 2", "countertop"),
        *receptacle("sinkbasin 1", "loc 3", "sinkbasin"),
        *receptacle("microwave 1", "loc 4", "microwave", openable=True),
        *receptacle("fridge 1", "loc 5", "fridge", openable=True),
        *receptacle("diningtable 1", "loc 6", "diningtable"),
        can("countertop", "apple"),
        can("diningtable", "apple"),
        can("cabinet", "apple"),
        can("countertop", "mug"),
    ]


def task(task_type: str, obj: str, parent: str = "", toggle: str = "") -> dict:
    return {
        "task_type": task_type,
        "pddl_params": {"object_target": obj, "parent_target": parent, "toggle_target": toggle},
    }


def apple_to_table_plan(task_type: str, *facts: Proposition) -> list[str]:
    """The expert's plan for a ``task_type`` task on an apple and the dining table, in :func:`kitchen` and
    ``facts``."""
    return ALFWorldExpert(task(task_type, "Apple", "DiningTable")).plan([*kitchen(), *facts])


# --- plan shapes ---


def test_pick_opens_closed_source_and_skips_goto_when_already_there():
    plan = apple_to_table_plan("pick_and_place_simple", at("loc 1"), *item("apple 1", "apple", "cabinet 1"))
    assert plan == [
        "open cabinet 1",
        "take apple 1 from cabinet 1",
        "go to diningtable 1",
        "move apple 1 to diningtable 1",
    ]


def test_prefers_the_cheaper_instance():
    plan = apple_to_table_plan(
        "pick_and_place_simple",
        at("loc 9"),
        *item("apple 1", "apple", "cabinet 1"),
        *item("apple 2", "apple", "countertop 1"),
    )
    assert plan[:2] == ["go to countertop 1", "take apple 2 from countertop 1"]
    assert len(plan) == 4


@pytest.mark.parametrize(
    ("task_type", "step"),
    [
        ("pick_clean_then_place_in_recep", ["go to sinkbasin 1", "clean apple 1 with sinkbasin 1"]),
        ("pick_heat_then_place_in_recep", ["go to microwave 1", "heat apple 1 with microwave 1"]),
        ("pick_cool_then_place_in_recep", ["go to fridge 1", "cool apple 1 with fridge 1"]),
    ],
)
def test_transform_tasks_visit_the_appliance_without_opening_it(task_type, step):
    plan = apple_to_table_plan(task_type, at("loc 9"), *item("apple 1", "apple", "countertop 1"))
    assert plan == [
        "go to countertop 1",
        "take apple 1 from countertop 1",
        *step,
        "go to diningtable 1",
        "move apple 1 to diningtable 1",
    ]


def test_transform_is_skipped_when_the_object_already_has_the_state():
    plan = apple_to_table_plan(
        "pick_heat_then_place_in_recep", at("loc 9"), *item("apple 1", "apple", "countertop 1", "ishot")
    )
    assert "heat apple 1 with microwave 1" not in plan


def test_pick_two_counts_an_object_already_in_place():
    plan = apple_to_table_plan(
        "pick_two_obj_and_place",
        at("loc 9"),
        *item("apple 1", "apple", "diningtable 1"),
        *item("apple 2", "apple", "countertop 1"),
        *item("apple 3", "apple", "cabinet 1"),
    )
    assert plan == [
        "go to countertop 1",
        "take apple 2 from countertop 1",
        "go to diningtable 1",
        "move apple 2 to diningtable 1",
    ]


def test_pick_two_from_scratch_places_two_distinct_objects():
    plan = apple_to_table_plan(
        "pick_two_obj_and_place",
        at("loc 9"),
        *item("apple 1", "apple", "cabinet 1"),
        *item("apple 2", "apple", "countertop 1"),
    )
    # Both orders take 9 steps; the tie breaks on the command text ("go to cabinet 1" < "go to countertop 1").
    assert plan == [
        "go to cabinet 1",
        "open cabinet 1",
        "take apple 1 from cabinet 1",
        "go to diningtable 1",
        "move apple 1 to diningtable 1",
        "go to countertop 1",
        "take apple 2 from countertop 1",
        "go to diningtable 1",
        "move apple 2 to diningtable 1",
    ]


def test_wrong_object_in_hand_is_put_down_first():
    plan = apple_to_table_plan(
        "pick_and_place_simple",
        at("loc 2"),
        fact("objecttype", ("mug 1", "object"), ("mugtype ", "otype")),
        fact("holds", ("agent1 ", "agent"), ("mug 1", "object")),
        *item("apple 1", "apple", "countertop 1"),
    )
    assert plan[:2] == ["move mug 1 to countertop 1", "take apple 1 from countertop 1"]


def test_look_fetches_then_uses_the_lamp():
    facts = [
        *receptacle("desk 1", "loc 1", "desk"),
        *receptacle("drawer 1", "loc 2", "drawer", openable=True),
        at("loc 9"),
        *item("book 1", "book", "drawer 1"),
        fact("objecttype", ("desklamp 1", "object"), ("desklamptype ", "otype")),
        fact("toggleable", ("desklamp 1", "object")),
        fact("inreceptacle", ("desklamp 1", "object"), ("desk 1", "receptacle")),
    ]
    plan = ALFWorldExpert(task("look_at_obj_in_light", "Book", toggle="DeskLamp")).plan(facts)
    assert plan == [
        "go to drawer 1",
        "open drawer 1",
        "take book 1 from drawer 1",
        "go to desk 1",
        "use desklamp 1",
    ]


def test_solved_state_gives_look_and_empty_plan():
    facts = [*kitchen(), at("loc 6"), *item("apple 1", "apple", "diningtable 1")]
    expert = ALFWorldExpert(task("pick_and_place_simple", "Apple", "DiningTable"))
    assert expert.plan(facts) == []
    assert expert.next_action(facts) == "look"


def test_wording_follows_the_admissible_commands():
    facts = [
        *kitchen(),
        at("loc 6"),
        fact("objecttype", ("apple 1", "object"), ("appletype ", "otype")),
        fact("holds", ("agent1 ", "agent"), ("apple 1", "object")),
    ]
    expert = ALFWorldExpert(task("pick_and_place_simple", "Apple", "DiningTable"))
    admissible = ["examine diningtable 1", "go to cabinet 1", "inventory", "put apple 1 in/on diningtable 1"]
    assert expert.next_action(facts, admissible) == "put apple 1 in/on diningtable 1"
    assert expert.next_action(facts) == "move apple 1 to diningtable 1"
    put_expert = ALFWorldExpert(task("pick_and_place_simple", "Apple", "DiningTable"), PlaceWording.PUT)
    assert put_expert.plan(facts) == ["put apple 1 in/on diningtable 1"]


@pytest.mark.parametrize(
    "bad",
    [
        {"task_type": "pick_and_place_with_movable_recep", "pddl_params": {"object_target": "Apple"}},
        {"task_type": "pick_and_place_simple", "pddl_params": {"object_target": "Apple"}},
        {"task_type": "look_at_obj_in_light", "pddl_params": {"object_target": "Book"}},
        {"pddl_params": {}},
    ],
)
def test_bad_task_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        ALFWorldExpert(bad)


def test_world_state_reads_engine_style_names():
    state = WorldState.from_facts(
        [at("loc 3"), *item("pen 1", "pen", "desk 1"), *receptacle("desk 1", "loc 1", "desk")]
    )
    assert state.agent_location == "loc 3"
    assert state.object_type == {"pen 1": "pentype"}
    assert state.containers == {"pen 1": ["desk 1"]}


# --- in the real engine ---


def play(
    engine: AlfredEngine,
    game,
    key: str,
    expert: ALFWorldExpert,
    wander: int = 0,
    rng: random.Random | None = None,
) -> tuple[bool, int]:
    """Play with the expert after ``wander`` random admissible commands; returns (won, expert steps)."""
    engine.reset(game, key=key)
    for _ in range(wander):  # may pick things up, open things, put things elsewhere, ...
        engine.step(rng.choice([c for c in engine.admissible_commands if c != "help"]))
        if engine.won:
            return True, 0
    for step in range(1, MAX_STEPS + 1):
        engine.step(expert.next_action(engine.facts(), engine.admissible_commands))
        if engine.won:
            return True, step
    return False, MAX_STEPS


@pytest.fixture(scope="module")
def engine() -> AlfredEngine:
    return AlfredEngine()


def _real_tasks(data_dir: Path, split: str):
    return load_tasks(split, data_dir=data_dir)


def problem_size(task) -> tuple[int, str]:
    return (task.trial_dir / "initial_state.pddl").stat().st_size, task.task_id


def test_one_real_valid_seen_trial_per_type(shared_alfworld_data, engine, tmp_path):
    # The smallest trial of each type (the engine's load time grows with the problem size).
    first = {}
    for t in sorted(_real_tasks(shared_alfworld_data, "valid_seen"), key=problem_size):
        first.setdefault(t.task_type, t)
    assert set(first) == set(TASK_TYPES)
    for task_type, t in sorted(first.items()):
        won, steps = play(engine, t.game_file(cache=tmp_path), t.task_id, ALFWorldExpert(t.traj_data()))
        assert won, f"expert failed {t.task_id}"
        assert steps <= 12, (task_type, steps)


@pytest.fixture(scope="module")
def generated(generated_root) -> Path:
    """Six generated training games, one per task type (made once per session by conftest)."""
    return generated_root


def test_expert_replays_the_generator_walkthrough_on_every_type(generated, engine):
    tasks = load_tasks("train", data_dir=generated)
    assert sorted(t.task_type for t in tasks) == sorted(TASK_TYPES)
    for t in tasks:
        game = json.loads(t.game_file().read_text())
        engine.reset(game, key=t.task_id)
        expert = ALFWorldExpert(t.traj_data())
        commands = []
        while not engine.won and len(commands) < MAX_STEPS:
            commands.append(expert.next_action(engine.facts(), engine.admissible_commands))
            engine.step(commands[-1])
        assert engine.won, t.task_id
        # The generator's walkthrough is the expert's plan on the generator's own model of the initial state:
        # the same commands mean the engine's facts describe exactly that state.
        assert commands == game["walkthrough"], t.task_id


def test_expert_recovers_after_random_actions(generated, engine):
    rng = random.Random(0)
    for t in load_tasks("train", data_dir=generated):
        won, _ = play(engine, t.game_file(), t.task_id, ALFWorldExpert(t.traj_data()), wander=8, rng=rng)
        assert won, t.task_id


# --- full sweeps (slow) ---


def sweep(data_dir: Path, split: str, tmp_path: Path) -> dict[str, list[tuple[bool, int]]]:
    engine = AlfredEngine(max_cached_games=1)
    results: dict[str, list[tuple[bool, int]]] = defaultdict(list)
    for t in _real_tasks(data_dir, split):
        results[t.task_type].append(
            play(engine, t.game_file(cache=tmp_path), t.task_id, ALFWorldExpert(t.traj_data()))
        )
    return results


@pytest.mark.slow
@pytest.mark.parametrize("split", ["valid_seen", "valid_train"])
def test_expert_sweep_on_real_trials(shared_alfworld_data, tmp_path, split):
    results = sweep(shared_alfworld_data, split, tmp_path)
    total = sum(len(r) for r in results.values())
    won = Counter({task_type: sum(w for w, _ in r) for task_type, r in results.items()})
    for task_type, r in sorted(results.items()):  # shown with `pytest -s`
        steps = [s for w, s in r if w]
        mean_steps = sum(steps) / max(1, len(steps))
        print(f"{split} {task_type}: {len(steps)}/{len(r)} won, {mean_steps:.2f} steps")
    assert total == {"valid_seen": 140, "valid_train": 200}[split]
    assert set(results) == set(TASK_TYPES)
    assert sum(won.values()) >= 0.98 * total, dict(won)
    for task_type, r in results.items():
        assert won[task_type] >= 0.9 * len(r), (task_type, won[task_type], len(r))


# --- the searching expert ---


def test_searching_expert_wins_every_type_going_only_where_the_agent_has_reason_to(generated, progpo_cache):
    """Through the env (``expert_mode="searching"``) on one generated game of each type: it wins, and every
    ``go to X`` it issues goes to a searched receptacle, the task's goal receptacle, or the first unsearched
    receptacle in the admissible order — never straight to where an unseen target hides."""
    from progpo_envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split="train", data_dir=generated, expert=True, expert_mode="searching", max_steps=60)
    planner_steps, searching_steps = [], []
    for index in range(env.num_tasks):
        obs, info = env.reset(options={"task_index": index})
        goal_type = ALFWorldExpert(env.task.traj_data()).goal_receptacle_type
        searched: set[str] = set()
        location, steps = None, 0
        while True:
            action = info["expert_action"]
            admissible = info["admissible_actions"]
            if location is not None and f"open {location}" not in admissible:
                searched.add(location)
            if action.startswith("go to "):
                target = action[len("go to ") :]
                unsearched = [a[6:] for a in admissible if a.startswith("go to ") and a[6:] not in searched]
                assert (
                    target in searched
                    or (goal_type and target.split(" ")[0] == goal_type)
                    or target == unsearched[0]
                ), (env.task.task_id, action, sorted(searched))
                location = target
            elif action == f"open {location}":
                searched.add(location)
            obs, _, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                break
        assert info["won"], f"searching expert failed {env.task.task_id}"
        searching_steps.append(steps)
        planner_steps.append(len(json.loads(env.game_file.read_text())["walkthrough"]))
    assert sum(searching_steps) >= sum(planner_steps)  # searching costs steps the true-state plan saves
    with pytest.raises(ValueError):
        ALFWorldEnv(split="train", data_dir=generated, expert=True, expert_mode="clairvoyant")
