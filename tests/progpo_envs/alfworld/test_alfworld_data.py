"""Task sets: ALFWorld's selection rules, rebuilding games into the cache, generated games by default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from progpo_envs.alfworld import wheel
from progpo_envs.alfworld.data import cache_dir, is_current_game, load_tasks, scene_number
from progpo_envs.alfworld.engine import AlfredEngine
from progpo_envs.alfworld.expert import PlaceWording
from progpo_envs.alfworld.generator import grammar_with_wording


def copy_trial(shared: Path, root: Path, split: str, folder: str, trial_index: int = 0) -> Path:
    """Copy one real trial (by task folder prefix) into ``root/json_2.1.1/split``; returns its new folder."""
    source = sorted((shared / "json_2.1.1" / "valid_seen").glob(f"{folder}*/*"))[trial_index]
    target = root / "json_2.1.1" / split / source.parent.name / source.name
    shutil.copytree(source, target)
    for path in [target, *target.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


@pytest.fixture
def data_root(tmp_path, shared_alfworld_data) -> Path:
    return tmp_path / "alfworld_data"


def test_selection_rules_and_rebuilds(data_root, shared_alfworld_data, progpo_cache):
    plain = copy_trial(shared_alfworld_data, data_root, "train", "pick_and_place_simple")
    unsolvable = copy_trial(shared_alfworld_data, data_root, "train", "pick_heat_then_place_in_recep")
    (unsolvable / "game.tw-pddl").write_text(json.dumps({"solvable": False}))
    no_key = copy_trial(shared_alfworld_data, data_root, "train", "pick_cool_then_place_in_recep")
    (no_key / "game.tw-pddl").write_text(json.dumps({"pddl_domain": "", "grammar": ""}))
    sliced = copy_trial(shared_alfworld_data, data_root, "train", "pick_clean_then_place_in_recep")
    sliced.parent.rename(sliced.parent.with_name(sliced.parent.name.replace("-None-", "Sliced-None-", 1)))
    movable = copy_trial(shared_alfworld_data, data_root, "train", "pick_two_obj_and_place")
    movable.parent.rename(movable.parent.with_name(movable.parent.name + "-movable"))
    tasks = load_tasks("train", data_root)
    assert [t.trial_dir for t in tasks] == [plain]

    before = sorted(p.name for p in plain.iterdir())
    game_file = tasks[0].game_file()
    assert sorted(p.name for p in plain.iterdir()) == before  # the data folder is never written to
    assert game_file.is_relative_to(progpo_cache / "alfworld" / "games") and game_file.suffix == ".tw-pddl"
    assert tasks[0].game_file() == game_file  # content-addressed: the same game maps to the same file
    game = json.loads(game_file.read_text())
    assert (
        is_current_game(game)
        and game["solvable"]
        and game["pddl_problem"] == (plain / "initial_state.pddl").read_text()
    )
    assert "Your task is to: put " in game["grammar"] or "Your task is to: " in game["grammar"]


def test_old_grammar_games_are_rebuilt_keeping_their_task_text(data_root, shared_alfworld_data, progpo_cache):
    trial = copy_trial(shared_alfworld_data, data_root, "valid_seen", "pick_and_place_simple")
    # Pre-0.4 games say ``put O in/on R`` and "You arrive at loc 10.": the generator's "put" wording plus the
    # old arrival text stands in for such a grammar.
    old_grammar = (
        grammar_with_wording(wheel.wheel_grammar(), PlaceWording.PUT)
        .replace("UNKNOWN GOAL", "put a pencil in dresser")
        .replace('"You arrive at {r.name}.', '"You arrive at loc {r.name}.')
    )
    old = {
        "pddl_domain": wheel.wheel_domain(),
        "grammar": old_grammar,
        "pddl_problem": (trial / "initial_state.pddl").read_text(),
        "solvable": True,
    }
    (trial / "game.tw-pddl").write_text(json.dumps(old))
    assert not is_current_game(old)
    task = load_tasks("valid_seen", data_root)[0]
    game_file = task.game_file()
    assert game_file != trial / "game.tw-pddl"
    engine = AlfredEngine()
    intro = engine.reset(game_file)
    assert intro.endswith("Your task is to: put a pencil in dresser.")
    assert not any(c.startswith("put ") for c in engine.admissible_commands)

    current = dict(old, grammar=wheel.wheel_grammar().replace("UNKNOWN GOAL", "put a pencil in dresser"))
    (trial / "game.tw-pddl").write_text(json.dumps(current))
    assert load_tasks("valid_seen", data_root)[0].game_file() == trial / "game.tw-pddl"


def test_rebuilt_task_text_is_deterministic(shared_alfworld_data, progpo_cache, tmp_path, monkeypatch):
    first = load_tasks("valid_seen", shared_alfworld_data)[:20]
    texts = [json.loads(t.game_file().read_text())["grammar"] for t in first]
    monkeypatch.setenv("PROGPO_CACHE", str(tmp_path / "other_cache"))
    again = [
        json.loads(t.game_file().read_text())["grammar"]
        for t in load_tasks("valid_seen", shared_alfworld_data)[:20]
    ]
    assert texts == again and all(p.is_relative_to(tmp_path) for p in (t.game_file() for t in first))


def test_alfworld_data_env_var_and_errors(shared_alfworld_data, tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(shared_alfworld_data))
    assert len(load_tasks("valid_seen")) == 140
    with pytest.raises(FileNotFoundError, match="contains json_2.1.1"):
        load_tasks("valid_seen", tmp_path)
    empty = tmp_path / "json_2.1.1" / "train"
    empty.mkdir(parents=True)
    with pytest.raises(ValueError, match="no playable"):
        load_tasks("train", tmp_path)


def test_importing_alfworld_does_not_set_alfworld_data(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    wheel.import_alfworld("alfworld.agents.utils.misc")
    import os

    assert "ALFWORLD_DATA" not in os.environ


def test_generated_games_are_the_default_and_cached(generated_root, progpo_cache):
    from progpo_envs.alfworld.env import ALFWorldEnv

    assert generated_root.is_relative_to(cache_dir())
    env = ALFWorldEnv(
        split="train", num_generated=6
    )  # no data_dir, no $ALFWORLD_DATA: the cached generated set
    assert [t.trial_dir for t in env.tasks] == [t.trial_dir for t in load_tasks("train", generated_root)]
    assert sorted(t.task_type for t in env.tasks) == sorted(
        {t.task_type for t in env.tasks}
    )  # one of each type
    with pytest.raises(FileNotFoundError, match="splits"):
        load_tasks("valid_train", num_generated=6)


def test_generated_put_wording_is_current_and_kept(tmp_path, progpo_cache):
    """A game set generated with the older ``put`` wording loads as it is (the option survives loading)."""
    from progpo_envs.alfworld.generator import generate_games

    root = tmp_path / "put_games"
    generate_games(root, 1, seed=3, splits=["valid_seen"], wording="put", workers=1, progress=False)
    task = load_tasks("valid_seen", root)[0]
    game = json.loads(task.game_file().read_text())
    assert is_current_game(game)
    assert task.game_file().is_relative_to(root)
    engine = AlfredEngine()
    engine.reset(task.game_file())
    for command in game["walkthrough"]:
        engine.step(command)
    assert engine.won and any(command.startswith("put ") for command in game["walkthrough"])


def test_task_types_and_scenes_select_real_trials(shared_alfworld_data):
    everything = load_tasks("valid_seen", shared_alfworld_data)
    picks = load_tasks("valid_seen", shared_alfworld_data, task_types=[1])  # ALFWorld's numbering
    assert picks and {t.task_type for t in picks} == {"pick_and_place_simple"}
    assert len(picks) == sum(t.task_type == "pick_and_place_simple" for t in everything)
    scene = scene_number(picks[0].task_id)
    json_scene = json.loads((picks[0].trial_dir / "traj_data.json").read_text())["scene"]["scene_num"]
    assert scene == json_scene  # the folder name's scene is the trial's scene
    in_scene = load_tasks("valid_seen", shared_alfworld_data, scenes=[scene])
    assert in_scene and all(scene_number(t.task_id) == scene for t in in_scene)
    assert len(in_scene) < len(everything)
    with pytest.raises(ValueError, match="unknown ALFWorld task type"):
        load_tasks("valid_seen", shared_alfworld_data, task_types=["pick_and_plaec_simple"])
    with pytest.raises(ValueError, match="no playable ALFWorld trial of task_types"):
        load_tasks("valid_seen", shared_alfworld_data, task_types=[1], scenes=[99999])


def test_restricted_generated_sets_hold_only_the_requested_tasks(progpo_cache):
    types, scenes = ["pick_and_place_simple", "look_at_obj_in_light"], [304, 316]
    tasks = load_tasks("valid_seen", num_generated=4, task_types=types, scenes=scenes)
    assert sorted(t.task_type for t in tasks) == sorted(types * 2)
    assert {scene_number(t.task_id) for t in tasks} <= set(scenes)
    default = load_tasks("valid_seen", num_generated=4)
    assert tasks[0].trial_dir.parents[2] != default[0].trial_dir.parents[2]  # its own cache folder
    again = load_tasks("valid_seen", num_generated=4, task_types=types, scenes=scenes)
    assert [t.trial_dir for t in again] == [t.trial_dir for t in tasks]
    with pytest.raises(ValueError, match="valid_unseen has only FloorPlans"):
        load_tasks("valid_unseen", num_generated=2, task_types=types, scenes=scenes)


def _data_trial_from(generated_root: Path, data_root: Path) -> Path:
    """A generated trial copied into ``data_root`` as real data without its game file (so it is rebuilt)."""
    source = sorted((generated_root / "json_2.1.1" / "train").glob("*/*"))[0]
    target = data_root / "json_2.1.1" / "valid_seen" / source.parent.name / source.name
    shutil.copytree(source, target)
    (target / "game.tw-pddl").unlink()
    return target


def test_a_damaged_cached_game_is_rebuilt(generated_root, progpo_cache, tmp_path):
    """Before: a damaged cache entry was trusted for ever and every reset raised JSONDecodeError."""
    import gymnasium as gym

    import progpo_envs  # noqa: F401

    data_root = tmp_path / "data"
    _data_trial_from(generated_root, data_root)
    game_file = load_tasks("valid_seen", data_root)[0].game_file()
    good = game_file.read_text()
    game_file.write_text('{"garbage": ')
    env = gym.make("progpo/ALFWorld-v0", data_dir=str(data_root), split="valid_seen")
    observation, _ = env.reset(seed=0)
    assert observation and game_file.read_text() == good
    env.close()


def test_a_damaged_game_in_a_read_only_cache_is_a_server_fault_naming_it(
    generated_root, tmp_path, read_only, monkeypatch
):
    """The env server answers 500 naming the file and the fix, logged once (before: 400 JSONDecodeError, the
    client blamed, on every reset)."""
    import requests

    from tests.progpo_envs.server.hosting_helpers import CliServer

    data_root = tmp_path / "data"
    _data_trial_from(generated_root, data_root)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PROGPO_CACHE", str(cache))
    game_file = load_tasks("valid_seen", data_root)[0].game_file()
    game_file.write_text('{"garbage": ')
    read_only(cache)
    kwargs = json.dumps({"data_dir": str(data_root), "split": "valid_seen"})
    server = CliServer("--env", "progpo/ALFWorld-v0", "--env-kwargs", f"progpo/ALFWorld-v0={kwargs}")
    try:
        for _ in range(2):
            answer = requests.post(
                f"{server.url}/instances", json={"env_id": "progpo/ALFWorld-v0", "seed": 0}, timeout=120
            )
            assert answer.status_code == 500, answer.text
            message = answer.json()["error"]
            assert str(game_file) in message and "writable" in message
    finally:
        server.stop()
        server.log.seek(0)
        log = server.log.read()
    assert log.count("env data error") == 1, log[-2000:]
