"""History keys: exact-prefix and window keys, incremental vs from-scratch, the window == prefix property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo_envs.core.hashing import KeyRole, combine, text_digest
from progpo_envs.core.history import HistoryTracker


def reference_keys(
    task_id: str, observations: list[str], actions: list[str], depths: tuple[int, ...]
) -> dict:
    """The keys of the last step, recomputed from the definitions in ``history.py``'s docstring."""
    task = text_digest(f"task:{task_id}")
    pairs = [(text_digest(o), text_digest(a)) for o, a in zip(observations[:-1], actions, strict=True)]
    current = text_digest(observations[-1])

    def fold(seed, chosen):
        chain = seed
        for obs_key, action_key in chosen:
            chain = combine(KeyRole.CHAIN, chain, obs_key, action_key)
        return combine(KeyRole.PREFIX, chain, current)

    out = {"obs_hash": current, "history_key": fold(task, pairs)}
    if depths:
        out["history_keys"] = {
            k: fold(task, pairs) if len(pairs) <= k else fold(combine(KeyRole.WINDOW, task, k), pairs[-k:])
            for k in depths
        }
    return out


def play(tracker: HistoryTracker, observations: list[str], actions: list[str]) -> list[dict]:
    keys = [tracker.reset(observations[0])]
    for action, observation in zip(actions, observations[1:], strict=True):
        keys.append(tracker.step(action, observation))
    return keys


words = st.text(alphabet="abc \n", max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(words, words), max_size=8), words, st.sampled_from([(), (1,), (2, 3), (1, 4)]))
def test_incremental_keys_equal_the_from_scratch_definition(steps, first_obs, depths):
    actions = [a for a, _ in steps]
    observations = [first_obs] + [o for _, o in steps]
    tracker = HistoryTracker(task_id="t-1", depths=depths)
    keys = play(tracker, observations, actions)
    for t in range(len(keys)):
        assert keys[t] == reference_keys("t-1", observations[: t + 1], actions[:t], tracker.depths)


def test_window_equals_prefix_while_the_history_fits_and_differs_after():
    tracker = HistoryTracker(task_id="pick-1", depths=(2,))
    observations = ["room", "desk", "drawer", "bed", "sofa"]
    actions = ["go to desk 1", "go to drawer 1", "go to bed 1", "go to sofa 1"]
    keys = play(tracker, observations, actions)
    for t, step_keys in enumerate(keys):
        if t <= 2:
            assert step_keys["history_keys"][2] == step_keys["history_key"]
        else:
            assert step_keys["history_keys"][2] != step_keys["history_key"]


def test_window_keys_forget_old_pairs_and_prefix_keys_do_not():
    depths = (1, 2)
    a = play(HistoryTracker("task", depths), ["s", "x", "y", "z"], ["a1", "a2", "a3"])[-1]
    b = play(HistoryTracker("task", depths), ["t", "x", "y", "z"], ["b1", "a2", "a3"])[-1]
    # Same last two (observation, action) pairs and current observation; different first pair.
    assert a["obs_hash"] == b["obs_hash"]
    assert a["history_keys"][2] == b["history_keys"][2]
    assert a["history_keys"][1] == b["history_keys"][1]
    assert a["history_key"] != b["history_key"]


def test_window_of_depth_two_sees_the_second_last_pair():
    a = play(HistoryTracker("task", (2,)), ["s", "x", "y"], ["a1", "a2"])[-1]
    b = play(HistoryTracker("task", (2,)), ["s", "x", "y"], ["a1", "b2"])[-1]
    assert a["history_keys"][2] != b["history_keys"][2]


def test_keys_depend_on_task_and_whitespace_does_not_matter():
    a = play(HistoryTracker("task-A", (1,)), ["room"], [])[-1]
    b = play(HistoryTracker("task-B", (1,)), ["room"], [])[-1]
    assert a["obs_hash"] == b["obs_hash"] and a["history_key"] != b["history_key"]
    c = play(HistoryTracker("task-A", (1,)), ["room", "desk"], ["go to  desk 1"])[-1]
    d = play(HistoryTracker("task-A", (1,)), [" room\n", "desk"], ["go to desk 1"])[-1]
    assert c == d


def test_reset_starts_over_and_set_task_applies_at_reset():
    tracker = HistoryTracker("task", (1,))
    first = play(tracker, ["room", "desk"], ["go"])
    again = play(tracker, ["room", "desk"], ["go"])
    assert first == again
    tracker.set_task("other")
    assert tracker.reset("room")["history_key"] != first[0]["history_key"]


def test_invalid_depths_are_rejected():
    with pytest.raises(ValueError):
        HistoryTracker("t", depths=(0,))
    assert HistoryTracker("t", depths=(3, 1, 3)).depths == (1, 3)
