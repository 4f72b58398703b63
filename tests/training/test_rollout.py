"""Group rollouts in a vector env: step rows, info keys carried, per-token data, every estimator plugs in."""

from __future__ import annotations

import numpy as np
import pytest

from agents.projection import demonstration_text
from progpo_envs.core.hashing import action_set_key, text_digest
from tests.training.training_helpers import policy_engine
from training.advantages import ESTIMATORS, compute_advantages
from training.policy import load_policy
from training.rollout import RolloutWorker


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    return load_policy(tiny_policy_dir, device="cpu")


def _worker(envs, policy, history_length=1):
    return RolloutWorker(envs, policy.tokenizer, history_length, 512)


def test_scripted_expert_rollout_rows(toy_vec, policy):
    result = _worker(toy_vec, policy).run(
        seed=5, task_indices=[0, 3], scripted=lambda info: demonstration_text(info["expert_action"])
    )
    rows = result.rows
    assert [e.won for e in result.episodes] == [True] * 4
    assert rows.num_rows == 8  # two steps per episode
    assert sorted(rows.group_id) == [0] * 4 + [1] * 4 and set(
        zip(rows.traj_id, rows.group_id, strict=True)
    ) == {
        (0, 0),
        (1, 0),
        (2, 1),
        (3, 1),
    }
    for traj in range(4):
        steps = [s for s, t in zip(rows.step, rows.traj_id, strict=True) if t == traj]
        assert steps == [0, 1]
    assert all(rows.valid)
    assert rows.action_key[0] == int(text_digest("take key 1"))
    # the state key is the env's obs_hash of the observation the action was taken in (not the prompt)
    assert rows.obs_key[0] == int(text_digest(rows.obs_text[0]))
    won_rows = [w for w in rows.won if w]
    assert len(won_rows) == 4 and sum(rows.reward) == 40.0
    # copies of a group share the task, so their first states are the same key
    assert rows.history_key[0] == rows.history_key[1]


def test_policy_rollout_records_logprobs_per_response_token(toy_vec, policy):
    sampling = {"engine": policy_engine(policy), "temperature": 1.0, "max_new_tokens": 6, "sampling_seed": 0}
    result = _worker(toy_vec, policy).run(seed=0, task_indices=[1, 2], **sampling)
    rows = result.rows
    assert rows.num_rows == 4 * 4  # a random policy never wins: every episode runs to max_steps=4
    pairs = zip(rows.response_ids, rows.old_logprobs, strict=True)
    assert all(len(r) == len(lp) and 1 <= len(r) <= 6 for r, lp in pairs)
    assert not any(rows.valid)  # random text has no <action> tags
    assert result.generated_tokens == sum(len(r) for r in rows.response_ids)
    assert all(
        p[-3:] == policy.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"][-3:]
        for p in rows.prompt_ids
    )


def test_history_length_changes_the_prompt(toy_vec, policy):
    script = lambda info: demonstration_text(info["expert_action"])  # noqa: E731
    short = _worker(toy_vec, policy, history_length=0).run(seed=1, task_indices=[0, 0], scripted=script)
    long = _worker(toy_vec, policy, history_length=2).run(seed=1, task_indices=[0, 0], scripted=script)
    second = [i for i, s in enumerate(short.rows.step) if s == 1][0]
    assert len(long.rows.prompt_ids[second]) > len(short.rows.prompt_ids[second])
    text = policy.tokenizer.decode(long.rows.prompt_ids[second])
    assert "take key 1" in text and "Prior to this step" in text


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_plugs_in(toy_vec, policy, name):
    """Expert and random-policy rollouts of the same tasks, merged into groups of 2 winners and 2 losers."""
    worker = _worker(toy_vec, policy)
    rows = worker.run(
        seed=2, task_indices=[0, 1], scripted=lambda info: demonstration_text(info["expert_action"])
    ).rows
    sampling = {"engine": policy_engine(policy), "max_new_tokens": 4, "sampling_seed": 1, "traj_offset": 4}
    rows.extend(worker.run(seed=2, task_indices=[0, 1], **sampling).rows)
    adv = compute_advantages(name, rows.estimator_columns(), invalid_penalty=0.1)
    assert adv.shape == (rows.num_rows,) and np.isfinite(adv).all()
    winners = np.asarray(rows.traj_id) < 4
    assert adv[winners].mean() > adv[~winners].mean()


def test_rows_carry_the_key_of_the_admissible_action_set(toy_vec, policy):
    rows = (
        _worker(toy_vec, policy)
        .run(seed=5, task_indices=[0, 3], scripted=lambda info: demonstration_text(info["expert_action"]))
        .rows
    )
    drawers = [f"open drawer {d}" for d in range(1, 5)]
    moves = [f"move key 1 to drawer {d}" for d in range(1, 5)]
    # the toy env's lists, written here in another order: the key is of the set
    before_take = action_set_key(["take key 1", *reversed(drawers), "inventory", "look"])
    holding = action_set_key([*moves[::-1], "look", *drawers, "inventory", "look"])
    expected = [int(before_take) if s == 0 else int(holding) for s in rows.step]
    assert rows.admissible_key == expected and before_take != holding
    columns = rows.estimator_columns()
    assert columns["admissible_key"].dtype == np.uint64
    # the step-0 and step-1 observations differ anyway here, so the finer key gives the same numbers
    np.testing.assert_array_equal(
        compute_advantages("graphgpo", columns, state_key="observation_actions"),
        compute_advantages("graphgpo", columns),
    )
