"""``progpo/ALFWorld-v0``: the Gymnasium contract, info, rewards, limits, malformed actions, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

import progpo_envs  # noqa: F401  (registers the ids)
from progpo_envs.alfworld.engine import NOTHING_HAPPENS
from progpo_envs.alfworld.env import ALFWorldEnv
from progpo_envs.alfworld.task_types import TASK_TYPES
from progpo_envs.core.checker import check_text_env


@pytest.fixture(scope="module")
def real_env(shared_alfworld_data, progpo_cache):
    env = gym.make("progpo/ALFWorld-v0", split="valid_seen", data_dir=shared_alfworld_data, expert=True)
    yield env
    env.close()


@pytest.fixture(scope="module")
def generated_env(generated_root):
    env = ALFWorldEnv(split="train", data_dir=generated_root, expert=True, history_depths=(1, 2))
    yield env
    env.close()


def play_expert(env, task_index: int, max_actions: int = 60):
    obs, info = env.reset(options={"task_index": task_index})
    total = 0.0
    for steps in range(1, max_actions + 1):  # noqa: B007  (the step count is returned)
        obs, reward, terminated, truncated, info = env.step(info["expert_action"])
        total += reward
        if terminated or truncated:
            break
    return info, total, steps, terminated, truncated


@pytest.mark.slow
def test_text_env_contract_real_data(real_env):
    check_text_env(real_env.unwrapped)


def test_text_env_contract_generated(generated_env, generated_root):
    check_text_env(generated_env)  # with the expert and history windows: every info key of the contract
    assert generated_env.metadata["prompt_style"] == "alfworld"
    assert ALFWorldEnv.split_names(data_dir=generated_root) == ("train",)  # the data's split folders


def test_reset_observation_and_info(real_env):
    obs, info = real_env.reset(options={"task_index": 0})
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert "\n\nYour task is to: " in obs and obs.endswith(".")
    assert info["task_index"] == 0 and info["task_id"] == real_env.unwrapped.tasks[0].task_id
    assert info["task_type"] in TASK_TYPES and info["won"] is False
    actions = info["admissible_actions"]
    assert actions and "help" not in actions and actions == sorted(actions) and "look" in actions
    assert isinstance(info["obs_hash"], np.uint64) and isinstance(info["history_key"], np.uint64)
    assert info["expert_action"] in actions


def test_expert_info_only_when_asked(generated_root):
    env = ALFWorldEnv(split="train", data_dir=generated_root)
    _, info = env.reset(options={"task_index": 0})
    assert "expert_action" not in info
    assert "history_keys" not in info


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_expert_wins_every_task_type_of_generated_games_with_reward_10(generated_env, task_type):
    index = next(i for i, t in enumerate(generated_env.tasks) if t.task_type == task_type)
    info, total, steps, terminated, truncated = play_expert(generated_env, index)
    assert info["won"] and terminated and not truncated and total == 10.0 and steps <= 50


def test_success_reward_option(generated_root):
    env = ALFWorldEnv(split="train", data_dir=generated_root, expert=True, success_reward=1.0)
    info, total, *_ = play_expert(env, 0)
    assert info["won"] and total == 1.0


def test_real_valid_seen_sample_plays_to_a_win(real_env):
    """One trial of each task type of the real valid_seen split, played by the expert within 50 steps."""
    tasks = real_env.unwrapped.tasks
    for task_type in TASK_TYPES:
        index = next(i for i, t in enumerate(tasks) if t.task_type == task_type)
        info, total, steps, terminated, _ = play_expert(real_env, index, max_actions=50)
        assert info["won"] and terminated and total == 10.0, (task_type, tasks[index].task_id, steps)


@pytest.mark.parametrize(
    "action",
    [
        "",
        "   ",
        "x" * 100_000,
        "go to\x00desk 1",
        "\udcff\udcfe",
        "jump over the moon",
        "GO TO DESK 1",
        b"look",
        None,
    ],
)
def test_malformed_and_inadmissible_actions_give_nothing_happens(generated_env, action):
    obs0, info0 = generated_env.reset(options={"task_index": 1})
    obs, reward, terminated, truncated, info = generated_env.step(action)
    assert (obs, reward, terminated, truncated) == (NOTHING_HAPPENS, 0.0, False, False)
    assert info["admissible_actions"] == info0["admissible_actions"] and not info["won"]
    assert info["expert_action"] == info0["expert_action"]  # the game state did not change


def test_whitespace_around_a_command_is_tolerated_like_the_engine(generated_env):
    _, info = generated_env.reset(options={"task_index": 1})
    command = info["admissible_actions"][0]
    assert generated_env.step(f"  {command} ")[0] != NOTHING_HAPPENS


def test_truncation_at_max_steps_and_latching(generated_root):
    env = ALFWorldEnv(split="train", data_dir=generated_root, max_steps=3)
    env.reset(options={"task_index": 0})
    flags = [env.step("look")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    obs, reward, terminated, truncated, _ = env.step("inventory")
    assert (reward, terminated, truncated) == (0.0, False, True) and env.unwrapped.elapsed_steps == 3


def test_default_max_steps_is_50(generated_root):
    env = ALFWorldEnv(split="train", data_dir=generated_root)
    env.reset(options={"task_index": 2})
    for _ in range(49):
        assert not env.step("look")[3]
    assert env.step("look")[3]


def test_task_selection(generated_env):
    assert generated_env.num_tasks == len(generated_env.tasks) == 6
    with pytest.raises(ValueError, match="out of range"):
        generated_env.reset(options={"task_index": 6})
    seeded = [generated_env.reset(seed=s)[1]["task_id"] for s in range(12)]
    assert seeded == [generated_env.reset(seed=s)[1]["task_id"] for s in range(12)]
    assert len(set(seeded)) > 1


def test_repeated_reset_reuses_the_loaded_game(generated_env):
    obs_a, info_a = generated_env.reset(options={"task_index": 3})
    generated_env.step(info_a["expert_action"])
    loaded = dict(generated_env.engine._games)
    obs_b, info_b = generated_env.reset(options={"task_index": 3})
    assert obs_a == obs_b and info_a["history_key"] == info_b["history_key"]
    assert generated_env.engine._games.keys() == loaded.keys()
    assert all(generated_env.engine._games[k] is loaded[k] for k in loaded)


def test_history_keys_in_an_episode(generated_env):
    _, info = generated_env.reset(options={"task_index": 0})
    assert info["history_keys"][1] == info["history_key"]
    first = generated_env.step("look")[4]
    second = generated_env.step("look")[4]
    assert (
        second["history_keys"][2] == second["history_key"]
        and second["history_keys"][1] != second["history_key"]
    )
    assert first["obs_hash"] == second["obs_hash"]


def test_real_splits_load_with_alfworlds_rules(shared_alfworld_data, progpo_cache):
    from progpo_envs.alfworld.data import load_tasks

    seen = load_tasks("valid_seen", shared_alfworld_data)
    assert len(seen) == 140 and set(Counter(t.task_type for t in seen)) == set(TASK_TYPES)
    assert [t.task_id for t in seen] == sorted(t.task_id for t in seen)
    train_sample = load_tasks("valid_train", shared_alfworld_data)
    assert len(train_sample) == 200
    with pytest.raises(FileNotFoundError, match="available"):
        load_tasks("valid_unseen", shared_alfworld_data)


ROLLOUT_SCRIPT = r"""
import json, sys
import numpy as np
import gymnasium as gym
import progpo_envs
from progpo_envs.core.hashing import hex_key

env = gym.make("progpo/ALFWorld-v0", split=sys.argv[1], data_dir=sys.argv[2], expert=True,
               history_depths=(1, 3))
out = []
for seed in (0, 1):
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    records = [[obs, info]]
    for t in range(6):
        action = info["expert_action"] if t % 2 else str(rng.choice(info["admissible_actions"]))
        obs, reward, terminated, truncated, info = env.step(action)
        records.append([obs, reward, terminated, truncated, info])
    out.append(records)

def encode(x):
    if isinstance(x, np.integer):
        return hex_key(x)
    if isinstance(x, dict):
        return {str(k): encode(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [encode(v) for v in x]
    return x

print(json.dumps(encode(out)))
"""


def test_same_seed_same_transcript_infos_and_hashes_across_processes(shared_alfworld_data, progpo_cache):
    def run(hash_seed: str) -> list:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", ROLLOUT_SCRIPT, "valid_seen", str(shared_alfworld_data)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    first, second = run("1"), run("2")
    assert first == second
    keys = [record[-1]["history_key"] for episode in first for record in episode]
    assert all(len(k) == 16 for k in keys) and len(set(keys)) > len(keys) // 2


def test_warm_up_loads_every_game_of_a_small_split_once(generated_root, monkeypatch):
    """A server worker warms up before it serves, so its memory does not grow with each game its instances
    meet for the first time (the soak's ALFWorld workers grew for half the run): after ``warm_up`` no reset
    of the split loads a game, and each plays what a cold env plays."""
    from progpo_envs.alfworld import engine as engine_module

    engine_module.clear_caches()
    warm = ALFWorldEnv(split="train", data_dir=generated_root)
    assert warm.warm_up() == warm.num_tasks
    warm.close()
    loads = Counter()
    original_load = engine_module.AlfredEngine._load
    monkeypatch.setattr(
        engine_module.AlfredEngine,
        "_load",
        lambda self, game: loads.update([str(game)]) or original_load(self, game),
    )
    env = ALFWorldEnv(split="train", data_dir=generated_root)
    observations = [env.reset(options={"task_index": i})[0] for i in range(env.num_tasks)]
    env.close()
    assert not loads
    engine_module.clear_caches()
    cold = ALFWorldEnv(split="train", data_dir=generated_root)
    assert [cold.reset(options={"task_index": i})[0] for i in range(cold.num_tasks)] == observations
    cold.close()
    assert len(loads) == cold.num_tasks


def test_warm_up_leaves_a_split_larger_than_the_game_cache_to_load_as_met(generated_root, monkeypatch):
    import progpo_envs.alfworld.env as env_module

    env = ALFWorldEnv(split="train", data_dir=generated_root)
    monkeypatch.setattr(env_module, "SHARED_GAMES_CAPACITY", env.num_tasks - 1)
    assert env.warm_up() == 0
    assert env.task is None and not env.engine._games
    env.close()
