"""The seeded ALFWorld generator: layout, six types won in the real engine, splits, wording, determinism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from progpo_envs.alfworld import generator
from progpo_envs.alfworld.data import load_tasks
from progpo_envs.alfworld.engine import AlfredEngine
from progpo_envs.alfworld.generator import (
    DATA_FOLDER,
    MANIFEST_NAME,
    UNSEEN_SCENES,
    Split,
    generate_games,
    generate_main,
    make_game,
    split_scenes,
)
from progpo_envs.alfworld.task_types import TASK_TYPES

SEED = 7
GAME_FILES = ("game.tw-pddl", "initial_state.pddl", "traj_data.json")
#: How conftest's ``generated_root`` was made (``data.generated_data_dir("train", NUM_GENERATED, seed=0)``).
ROOT_SEED, ROOT_SPLIT = 0, "train"


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (POSIX relative path → bytes)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def generated(generated_root) -> Path:
    """Six generated training games, one per task type (made once per session by conftest)."""
    return generated_root


@pytest.fixture(scope="module")
def engine() -> AlfredEngine:
    return AlfredEngine()


def test_layout_is_alfworlds(generated):
    trials = sorted((generated / DATA_FOLDER / ROOT_SPLIT).glob("*/*"))
    assert len(trials) == 6
    for trial in trials:
        assert sorted(p.name for p in trial.iterdir()) == sorted(GAME_FILES)
        traj = json.loads((trial / "traj_data.json").read_text())
        params = traj["pddl_params"]
        # <task_type>-<Obj>-<MRecep|None>-<Parent|Toggle>-<scene>/<trial>
        second = params["toggle_target"] or params["parent_target"]
        assert (
            trial.parent.name
            == f"{traj['task_type']}-{params['object_target']}-None-{second}-{traj['scene']['scene_num']}"
        )
        assert trial.name == traj["task_id"]
        game = json.loads((trial / "game.tw-pddl").read_text())
        assert game["solvable"] is True
        assert game["pddl_problem"] == (trial / "initial_state.pddl").read_text()
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert f"Your task is to: {traj['generator']['task_desc']}." in game["grammar"]
        # ALFWorld's own collector would skip these path parts.
        assert "movable" not in str(trial) and "Sliced" not in str(trial)
    manifest = json.loads((generated / DATA_FOLDER / ROOT_SPLIT / MANIFEST_NAME).read_text())
    assert manifest["seed"] == ROOT_SEED and manifest["split"] == ROOT_SPLIT
    assert sorted(manifest["games"]) == [trial.relative_to(generated).as_posix() for trial in trials]


def test_every_task_type_is_won_by_its_walkthrough_in_the_real_engine(generated, engine):
    tasks = load_tasks(ROOT_SPLIT, data_dir=generated)
    assert sorted(t.task_type for t in tasks) == sorted(TASK_TYPES)
    for task in tasks:
        game = json.loads(task.game_file().read_text())
        walkthrough = game["walkthrough"]
        intro = engine.reset(game, key=task.task_id)
        assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert "You are in the middle of a room." in intro
        assert not engine.won
        for command in walkthrough:
            assert command in engine.admissible_commands, (task.task_id, command)
            assert not engine.won
            assert engine.step(command) != "Nothing happens."
        assert engine.won, task.task_id
        # What the games look like: ALFWorld's kinds of commands, a handful of steps.
        assert 3 <= len(walkthrough) <= 16
        verbs = {c.split()[0] for c in walkthrough}
        kind = task.task_type
        assert ("use" in verbs) == (kind == "look_at_obj_in_light")
        assert ("clean" in verbs) == (kind == "pick_clean_then_place_in_recep")
        assert ("heat" in verbs) == (kind == "pick_heat_then_place_in_recep")
        assert ("cool" in verbs) == (kind == "pick_cool_then_place_in_recep")
        moves = sum(c.startswith("move ") for c in walkthrough)
        assert moves == {"look_at_obj_in_light": 0, "pick_two_obj_and_place": 2}.get(kind, 1)


def test_goal_does_not_hold_at_start_and_nothing_happens_is_inert(generated, engine):
    task = load_tasks(ROOT_SPLIT, data_dir=generated)[0]
    engine.reset(task.game_file(), key=task.task_id)
    before = engine.admissible_commands
    assert engine.step("fly to the moon") == "Nothing happens."
    assert engine.admissible_commands == before and not engine.won


def test_splits_hold_out_the_unseen_scenes(generated):
    assert split_scenes("valid_unseen") == UNSEEN_SCENES == (10, 219, 308, 424)
    seen = set(split_scenes("train"))
    assert seen == set(split_scenes("valid_seen"))
    assert not seen & set(UNSEEN_SCENES)
    for path in (generated / DATA_FOLDER / ROOT_SPLIT).glob("*/*/traj_data.json"):
        assert json.loads(path.read_text())["scene"]["scene_num"] in seen
    unseen = make_game(SEED, Split.VALID_UNSEEN, 2)  # clean: kitchen 10 or bathroom 424
    assert json.loads(unseen.files["traj_data.json"])["scene"]["scene_num"] in (10, 424)
    assert unseen.relative_dir.startswith(f"{DATA_FOLDER}/valid_unseen/pick_clean_then_place_in_recep-")


def test_each_game_is_a_pure_function_of_seed_split_index(generated):
    # Game 5 made on its own is byte-identical to game 5 of the set (so a larger n only appends games).
    alone = make_game(ROOT_SEED, ROOT_SPLIT, 5)
    folder = generated / alone.relative_dir
    assert {name: (folder / name).read_text() for name in GAME_FILES} == alone.files
    assert make_game(ROOT_SEED + 1, ROOT_SPLIT, 5).files != alone.files


def test_same_bytes_in_another_process_with_parallel_workers(generated, tmp_path):
    out = tmp_path / "subprocess"
    code = (
        "import sys; from progpo_envs.alfworld.generator import generate_main; "
        f"sys.exit(generate_main(['--out', {str(out)!r}, '--n', '2', '--seed', '{ROOT_SEED}', "
        f"'--splits', '{ROOT_SPLIT}', '--workers', '2']))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    theirs, ours = tree_bytes(out), tree_bytes(generated)
    games = [name for name in theirs if not name.endswith(MANIFEST_NAME)]
    assert len(games) == 2 * len(GAME_FILES)
    assert {name: theirs[name] for name in games} == {name: ours[name] for name in games}


def test_put_wording_of_older_releases(tmp_path, engine):
    pick = make_game(SEED, "valid_seen", 0, wording="put")  # index 0: pick_and_place_simple
    game = json.loads(pick.files["game.tw-pddl"])
    placing = [c for c in pick.walkthrough if " in/on " in c]
    assert len(placing) == 1 and placing[0].startswith("put ")
    assert not any(c.startswith("move ") for c in pick.walkthrough)
    engine.reset(game, key="put-wording")
    for command in pick.walkthrough[:-1]:
        engine.step(command)
    assert not any(c.startswith("move ") for c in engine.admissible_commands)
    obj, receptacle = placing[0][len("put ") :].split(" in/on ")
    assert engine.step(placing[0]) == f"You put the {obj} in/on the {receptacle}."
    assert engine.won
    # The same game in 0.4 wording differs only in the grammar's placing text.
    move = make_game(SEED, "valid_seen", 0, wording="move")
    assert move.files["initial_state.pddl"] == pick.files["initial_state.pddl"]
    assert move.walkthrough[-1] == f"move {obj} to {receptacle}"


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError):
        generate_games(tmp_path, n=-1)
    with pytest.raises(ValueError):
        generate_games(tmp_path, n=1, splits=("test_unseen",))
    with pytest.raises(ValueError):
        generate_games(tmp_path, n=1, wording="place")
    with pytest.raises(SystemExit):
        generate_main(["--out", str(tmp_path), "--n", "-2"])
    with pytest.raises(ValueError):
        generator.grammar_with_wording("no placing rule here", generator.PlaceWording.PUT)


def test_cli_writes_the_games(tmp_path, capsys):
    assert (
        generate_main(
            ["--out", str(tmp_path), "--n", "1", "--seed", "3", "--splits", "train", "--workers", "1"]
        )
        == 0
    )
    assert "wrote 1 games" in capsys.readouterr().out
    (trial,) = (tmp_path / DATA_FOLDER / "train").glob("*/*")
    assert trial.parent.name.startswith("pick_and_place_simple-")


@pytest.mark.slow
def test_alfworlds_handcoded_expert_solves_generated_games(tmp_path):
    """Cross-check with ALFWorld's handcoded expert (reads traj_data.json; never solves pick two: skipped)."""
    import textworld
    from textworld.envs.pddl import PddlEnv

    from progpo_envs.alfworld import wheel

    tw_env = wheel.import_alfworld("alfworld.agents.environment.alfred_tw_env")
    generate_games(tmp_path, n=12, seed=SEED, splits=("valid_seen",), progress=False)
    won = []
    for task in load_tasks("valid_seen", data_dir=tmp_path):
        if task.task_type == "pick_two_obj_and_place":
            continue
        infos = textworld.EnvInfos(
            won=True, admissible_commands=True, facts=True, extras=["gamefile", "expert_plan"]
        )
        env = tw_env.AlfredInfos(tw_env.AlfredDemangler(PddlEnv(infos), shuffle=False))
        env = tw_env.AlfredExpert(env, expert_type="handcoded")
        env.load(str(task.game_file()))
        state = env.reset()
        for _ in range(50):
            state, _, _ = env.step(state["extra.expert_plan"][0])
            if state["won"]:
                break
        won.append(bool(state["won"]))
    assert len(won) == 10
    assert sum(won) >= 8, won
