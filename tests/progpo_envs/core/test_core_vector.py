"""GroupVectorEnv with the toy env, in-process and in subprocesses."""

from __future__ import annotations

from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from progpo_envs.core.vector import GroupVectorEnv
from progpo_envs.testing import COUNTER_ENV_ID

TOY_ID = COUNTER_ENV_ID

MODES = ["sync", "async"]


@pytest.fixture(params=MODES)
def vector_mode(request) -> str:
    return request.param


def make(vector_mode: str, num_envs: int = 6, group_size: int = 2, **kwargs) -> GroupVectorEnv:
    return gym.make_vec(
        TOY_ID, num_envs=num_envs, group_size=group_size, vector_mode=vector_mode, num_workers=2, **kwargs
    )


def test_make_vec_builds_a_group_vector_env(vector_mode):
    with closing(make(vector_mode)) as envs:
        assert isinstance(envs, GroupVectorEnv) and envs.num_envs == 6 and envs.num_groups == 3
        assert envs.metadata["autoreset_mode"] is AutoresetMode.DISABLED
        assert envs.observation_space.contains(("a",) * 6)


def test_groups_share_tasks_and_info_has_group_and_task_ids(vector_mode):
    with closing(make(vector_mode)) as envs:
        obs, info = envs.reset(seed=11)
        assert info["group_id"].tolist() == [0, 0, 1, 1, 2, 2]
        task_ids = info["task_id"].tolist()
        for g in range(3):
            assert task_ids[2 * g] == task_ids[2 * g + 1] and obs[2 * g] == obs[2 * g + 1]
            assert info["history_key"][2 * g] == info["history_key"][2 * g + 1]
        obs2, info2 = envs.reset(seed=11)
        assert obs2 == obs and info2["task_id"].tolist() == task_ids
        _, info3 = envs.reset(options={"task_indices": [4, 0, 2]})
        assert info3["task_id"].tolist() == ["count-6"] * 2 + ["count-2"] * 2 + ["count-4"] * 2
        _, info4 = envs.reset(options={"task_index": 1})
        assert set(info4["task_id"].tolist()) == {"count-3"}


def test_ended_copies_latch_until_reset(vector_mode):
    with closing(make(vector_mode, num_envs=4, group_size=2, max_steps=4)) as envs:
        envs.reset(
            options={"task_indices": [0, 3]}
        )  # group 0 counts to 2, group 1 to 5 (unreachable in 4 steps)
        envs.step(["inc", "look", "inc", "inc"])
        obs, rewards, term, trunc, info = envs.step(["inc", "look", "inc", "inc"])
        assert term.tolist() == [True, False, False, False] and rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
        final_obs, final_key = obs[0], info["history_key"][0]
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)
        assert term.tolist() == [True, False, False, False] and rewards.tolist() == [0.0] * 4
        assert obs[0] == final_obs and info["history_key"][0] == final_key
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)
        assert term.tolist() == [True, True, False, False] and trunc.tolist() == [False, False, True, True]
        assert rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
        obs, rewards, term, trunc, info = envs.step(["inc"] * 4)  # everything ended: nothing moves
        assert (term | trunc).all() and rewards.sum() == 0.0
        assert list(envs.call("engine_steps")) == [2, 4, 4, 4]
        envs.reset(options={"task_indices": [0, 0]})
        assert not envs.step(["look"] * 4)[2].any()


def test_seedless_resets_draw_group_seeds_from_the_vector_generator(vector_mode):
    with closing(make(vector_mode, num_envs=4, group_size=2)) as envs:
        envs.reset(seed=3)
        _, a = envs.reset()
        envs.reset(seed=3)
        _, b = envs.reset()
        assert a["task_id"].tolist() == b["task_id"].tolist()
        assert a["task_id"][0] == a["task_id"][1] and a["task_id"][2] == a["task_id"][3]


def test_sync_and_async_give_identical_rollouts():
    results = []
    for mode in MODES:
        with closing(make(mode, num_envs=4, group_size=2, history_depths=(1,))) as envs:
            obs, info = envs.reset(seed=5)
            steps = [envs.step(["inc", "look", "dec", "inc"]) for _ in range(3)]
            results.append(
                (
                    obs,
                    info["history_key"].tolist(),
                    [(s[0], s[1].tolist(), s[4]["history_key"].tolist()) for s in steps],
                )
            )
    assert results[0] == results[1]


def test_step_some_steps_only_those_copies_as_a_full_step_would(vector_mode):
    """A per-episode rollout steps the copies whose decisions arrived and leaves the others untouched; the
    results are those of the same actions in a full step (copies sharded over 2 workers under async)."""
    with closing(make(vector_mode)) as subset, closing(make(vector_mode)) as whole:
        subset.reset(seed=7)
        whole.reset(seed=7)
        obs, rewards, term, trunc, infos = subset.step_some([4, 1], ["inc", "dec"])
        full = whole.step_copies(["look", "dec", "look", "look", "inc", "look"])
        assert obs == (full[0][4], full[0][1]) and rewards.tolist() == [full[1][4], full[1][1]]
        assert [i["history_key"] for i in infos] == [full[4][4]["history_key"], full[4][1]["history_key"]]
        assert [i["group_id"] for i in infos] == [2, 0]
        assert list(subset.call("engine_steps")) == [0, 1, 0, 0, 1, 0]
        with pytest.raises(ValueError, match="distinct"):
            subset.step_some([1, 1], ["inc", "inc"])


def test_reset_group_starts_one_group_while_the_others_play(vector_mode):
    with (
        closing(make(vector_mode)) as envs,
        closing(make(vector_mode)) as control,
        closing(make(vector_mode, num_envs=2, group_size=2)) as single,
    ):
        for e in (envs, control):
            e.reset(options={"task_indices": [0, 1, 2]})
            e.step(["inc"] * 6)
        obs, infos = envs.reset_group(1, seed=3, options={"task_index": 4})
        assert len(obs) == 2 and obs[0] == obs[1]
        assert [i["group_id"] for i in infos] == [1, 1] and infos[0]["task_id"] == infos[1]["task_id"]
        alone, _ = single.reset(seed=3, options={"task_index": 4})
        assert alone == obs  # the same seed and task as a fresh reset of that group alone
        # the other groups kept their state: their next step is the one of an env never reset
        others = [0, 1, 4, 5]
        moved, expected = envs.step_some(others, ["inc"] * 4), control.step_some(others, ["inc"] * 4)
        assert moved[0] == expected[0] and moved[1].tolist() == expected[1].tolist()
        assert [i["history_key"] for i in moved[4]] == [i["history_key"] for i in expected[4]]


def test_bad_arguments(vector_mode):
    with pytest.raises(ValueError, match="multiple"):
        make(vector_mode, num_envs=5, group_size=2)
    with closing(make(vector_mode, num_envs=2, group_size=1)) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="expected 2 actions"):
            envs.step(["inc"])
        with pytest.raises(ValueError, match="task_indices"):
            envs.reset(options={"task_indices": [0]})
        assert envs.get_attr("num_tasks") == (5, 5)


def test_async_worker_errors_are_reported():
    with closing(make("async", num_envs=2, group_size=1)) as envs:
        with pytest.raises(RuntimeError, match="out of range"):
            envs.reset(options={"task_index": 99})


def test_malformed_actions_in_a_vector(vector_mode):
    with closing(make(vector_mode, num_envs=2, group_size=2)) as envs:
        envs.reset(seed=0)
        obs, rewards, term, trunc, _ = envs.step(["", "x" * 10_000])
        assert obs == ("Nothing happens.", "Nothing happens.") and not term.any() and not trunc.any()


def test_info_masks_are_present():
    with closing(make("sync", num_envs=2, group_size=1)) as envs:
        _, info = envs.reset(seed=0)
        assert info["_group_id"].all() and info["_task_id"].all()
        assert info["history_key"].dtype == np.uint64 or info["history_key"].dtype == object


def _fold_add_info(envs: GroupVectorEnv, infos: list[dict]) -> dict:
    """Gymnasium's own merge (``_add_info`` folded over the copies): what ``batch_infos`` must give."""
    merged: dict = {}
    for i, info in enumerate(infos):
        merged = envs._add_info(merged, {**info, "group_id": int(envs.group_ids[i])}, i)
    return merged


def _merge(envs: GroupVectorEnv, infos: list[dict]) -> dict:
    return envs.batch_infos(envs._tag_groups(infos))


def _assert_same_batched(got: dict, want: dict, path: str = "info") -> None:
    assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
    for key, expected in want.items():
        value = got[key]
        if isinstance(expected, dict):
            assert isinstance(value, dict), f"{path}.{key}"
            _assert_same_batched(value, expected, f"{path}.{key}")
            continue
        if not isinstance(expected, np.ndarray):  # only irregular infos put other values in Gymnasium's merge
            assert type(value) is type(expected) and value == expected, f"{path}.{key}"
            continue
        assert isinstance(value, np.ndarray) and value.dtype == expected.dtype, f"{path}.{key}: {value!r}"
        assert value.shape == expected.shape, f"{path}.{key}"
        flat, flat_expected = value.reshape(len(value), -1), expected.reshape(len(value), -1)
        for a, b in zip(flat.tolist(), flat_expected.tolist(), strict=True):
            assert [type(x) for x in a] == [type(x) for x in b] and a == b, f"{path}.{key}: {a!r} != {b!r}"


MIXED_INFOS = [
    {  # every kind of value _add_info distinguishes, nested history_keys, a final_obs
        "won": False,
        "score": 1,
        "ratio": 0.5,
        "hash": np.uint64(2**63 + 5),
        "small": np.int8(-3),
        "flag": np.bool_(True),
        "vec": np.arange(3, dtype=np.float32),
        "text": "look",
        "actions": ["a", "b"],
        "none": None,
        "history_keys": {1: np.uint64(7), 2: np.uint64(9)},
        "final_obs": "the end",
    },
    {  # missing keys, a key first seen here, an int into a float column and a float into an int column
        "won": True,
        "score": 2.75,
        "ratio": 3,
        "hash": np.uint64(1),
        "history_keys": {2: np.uint64(11)},
        "late": {"deep": {"x": 1}},
        "text": None,
        "final_obs": ["kept", "as", "one", "object"],
    },
    {},
    {"actions": [], "vec": np.ones(3), "late": {"deep": {"y": "z"}}, "flag": False, "group_id": 99},
]


def test_merged_infos_equal_gymnasium_add_info_on_mixed_infos():
    with closing(make("sync", num_envs=4, group_size=2)) as envs:
        _assert_same_batched(_merge(envs, MIXED_INFOS), _fold_add_info(envs, MIXED_INFOS))
        one = MIXED_INFOS[:1] * 4  # every copy with every key: all-True masks
        _assert_same_batched(_merge(envs, one), _fold_add_info(envs, one))


def test_merged_infos_fall_back_to_gymnasium_on_irregular_keys():
    with closing(make("sync", num_envs=2, group_size=1)) as envs:
        for clash in (
            [{"x": 1, "_x": 5}, {"x": 2}],  # a key named like another key's mask
            [{1: 5, "1": 6}, {1: 7}],  # two keys with one mask name
        ):
            _assert_same_batched(_merge(envs, clash), _fold_add_info(envs, clash))
        flat_then_nested = [{"x": {"y": 2}}, {"x": 1}]  # Gymnasium puts the 1 under key 1 of the nested dict
        merged = _merge(envs, flat_then_nested)
        assert merged["x"][1] == 1
        _assert_same_batched(merged, _fold_add_info(envs, flat_then_nested))
        nested_then_flat = [{"x": 1}, {"x": {"y": 2}}]  # Gymnasium's merge fails on this; so must ours, alike
        with pytest.raises(Exception) as ours:
            _merge(envs, nested_then_flat)
        with pytest.raises(Exception) as theirs:
            _fold_add_info(envs, nested_then_flat)
        assert type(ours.value) is type(theirs.value)


def test_merged_infos_equal_gymnasium_add_info_on_rollouts(vector_mode):
    with closing(make(vector_mode, num_envs=4, group_size=2, max_steps=3)) as envs:
        envs.reset(seed=3)
        for _ in range(4):  # past the step limit: ended copies latch
            results = envs.backend.step(["inc"] * 4)
            infos = [r[4] for r in results]
            _assert_same_batched(_merge(envs, infos), _fold_add_info(envs, infos))


def test_seedless_resets_continue_the_generator_of_the_last_seeded_reset():
    with closing(make("sync", num_envs=4, group_size=2)) as envs:
        expected = np.random.default_rng(3)
        envs.reset(seed=3)
        for _ in range(2):
            envs.reset()
            group_seeds = [int(s) for s in expected.integers(0, 2**31 - 1, 2)]
            assert list(envs.get_attr("np_random_seed")) == [s for s in group_seeds for _ in range(2)]
        envs.reset(seed=3)  # a seeded reset restarts the sequence
        envs.reset()
        first = [int(s) for s in np.random.default_rng(3).integers(0, 2**31 - 1, 2)]
        assert list(envs.get_attr("np_random_seed")) == [s for s in first for _ in range(2)]


def test_copy_info_copies_like_deepcopy():
    """The info of a latched copy (``TextEnv.step`` after the episode ended) is a deep copy, aliasing kept."""
    import copy

    from progpo_envs.core.text_env import copy_info

    shared = ["a", "b"]
    info = {
        "admissible_actions": shared,
        "again": shared,
        "nested": {"list": [1, [2.5, None]], "same": shared},
        "hash": np.uint64(5),
        "flag": np.bool_(True),
        "array": np.arange(3),
        "pair": ([1], "x"),
        7: b"raw",
    }
    info["self"] = info  # a cycle
    copied, expected = copy_info(info), copy.deepcopy(info)
    assert list(copied) == list(expected)
    assert copied["admissible_actions"] == shared and copied["admissible_actions"] is not shared
    assert copied["again"] is copied["admissible_actions"] is copied["nested"]["same"]  # aliasing kept
    assert copied["self"] is copied and copied["nested"]["list"][1] is not info["nested"]["list"][1]
    assert copied["pair"] == expected["pair"] and copied["pair"][0] is not info["pair"][0]
    assert copied["array"] is not info["array"] and copied["array"].tolist() == [0, 1, 2]
    assert type(copied["hash"]) is np.uint64 and copied["hash"] == 5 and type(copied["flag"]) is np.bool_


def test_latched_copies_return_independent_copies_of_the_final_info():
    with closing(make("sync", num_envs=2, group_size=1, max_steps=1, history_depths=(1, 2))) as envs:
        envs.reset(seed=0)
        *_, final = envs.step(["inc", "inc"])
        for _ in range(2):  # callers that change the (nested) infos of ended copies change nothing in the env
            for _, _, _, _, info in envs.backend.step(["inc"] * 2):
                info["history_keys"].clear()
                info["task_id"] = "changed"
        *_, latched = envs.step(["inc", "inc"])
        assert latched["task_id"].tolist() == final["task_id"].tolist()
        for depth in (1, 2):
            assert latched["history_keys"][depth].tolist() == final["history_keys"][depth].tolist()
