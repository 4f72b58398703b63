"""The verl-agent adapter (:mod:`progpo_verl.rows`) against our estimators on the same rows, and against
verl-agent's own episode and GiGPO statistics (a numpy oracle of ``gigpo/core_gigpo.py`` at 20bd331, checked
against the real file by ``test_verl_agent_source.py`` when a verl-agent checkout is given).

Batches are DataProto-shaped (torch tensors, numpy object columns) as the rollout loop makes them, then padded
with ``adjust_batch``-style copies and shuffled as ``_balance_batch`` does."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from progpo_verl.estimator import estimator_spec
from progpo_verl.rows import (
    ACTION_COLUMN,
    STEP_COLUMN,
    Duplicates,
    RowOptions,
    estimator_rows,
    step_tags,
    token_advantages,
)
from tests.progpo_verl.verl_batches import pad_and_shuffle, rollout_batch
from training.advantages import ESTIMATORS, compute_advantages

PENALTY = 0.1


def truth_columns(truth: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The estimator columns of the batch's rows, built from what each row is (not through the adapter)."""
    return {
        "group_id": truth["group"],
        "traj_id": truth["traj"],
        "step": truth["step"],
        "reward": truth["reward"],
        "won": truth["won"],
        "valid": truth["valid"],
        "obs_key": truth["obs"],
        "action_key": truth["action"],
        "obs_text": truth["obs"],
    }


def with_copies_counted(truth: dict[str, np.ndarray], copies: np.ndarray) -> dict[str, np.ndarray]:
    """The rows plus each copy as a one-step trajectory of its group whose reward is its episode reward."""
    columns = truth_columns(truth)
    first_traj = int(truth["traj"].max()) + 1
    extra = {
        "group_id": truth["group"][copies],
        "traj_id": first_traj + np.arange(copies.size),
        "step": np.zeros(copies.size, dtype=np.int64),
        "reward": truth["episode_reward"][copies],
        "won": truth["episode_reward"][copies] >= 10.0,
        "valid": truth["valid"][copies],
        "obs_key": truth["obs"][copies],
        "action_key": truth["action"][copies],
        "obs_text": truth["obs"][copies],
    }
    return {k: np.concatenate([columns[k], extra[k]]) for k in columns}


def verl_agent_gigpo(batch, gamma: float, step_weight: float, eps: float = 1e-6, *, with_std: bool = True):
    """verl-agent's GiGPO on a batch, as ``compute_gigpo_outcome_advantage`` computes it (numpy, float64):
    episode statistics over every row of a ``uid`` (copies included), step statistics over the rows of equal
    anchor in a ``uid``, step returns discounted in play order before padding; the penalty is subtracted
    from the row's score and step return. Returns ``(episode, step)`` terms per row."""
    nt = batch.non_tensor_batch
    invalid = 1.0 - nt["is_action_valid"].astype(float)
    scores = nt["episode_rewards"].astype(float) - PENALTY * invalid
    returns = nt["progpo_returns"].astype(float) - PENALTY * invalid

    def normalise(values, keys, singleton_mean_zero):
        members = defaultdict(list)
        for i, key in enumerate(keys):
            members[key].append(i)
        out = np.empty_like(values)
        for rows in members.values():
            v = values[rows]
            if len(rows) == 1:
                mean, std = (0.0 if singleton_mean_zero else v[0]), 1.0
            else:
                mean, std = v.mean(), v.std(ddof=1)
            out[rows] = (v - mean) / (std + eps) if with_std else v - mean
        return out

    episode = normalise(scores, nt["uid"].tolist(), singleton_mean_zero=True)
    anchors = list(zip(nt["uid"].tolist(), nt["anchor_obs"].tolist(), strict=True))
    step = normalise(returns, anchors, singleton_mean_zero=False)
    return episode, step_weight * step


def discounted_returns_in_play_order(batch, gamma: float) -> np.ndarray:
    """verl-agent's ``compute_step_discounted_returns`` (Eq. 5), before ``adjust_batch``: per trajectory, from
    the end, in row order."""
    nt = batch.non_tensor_batch
    rewards = nt["rewards"].astype(float)
    out = np.zeros_like(rewards)
    for traj in set(nt["traj_uid"].tolist()):
        rows = np.flatnonzero(nt["traj_uid"] == traj)
        running = 0.0
        for i in rows[::-1]:
            running = rewards[i] + gamma * running
            out[i] = running
    return out


def test_step_tags_are_each_rows_step_in_play_order():
    batch, truth = rollout_batch(0)
    np.testing.assert_array_equal(step_tags(batch.non_tensor_batch["traj_uid"]), truth["step"])


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_dedupe_matches_the_estimator_on_the_same_rows(name):
    """Shuffled and padded with copies: every row gets the advantage of its (trajectory, step) as computed
    on the rows themselves, and verl's token-level advantages carry it on the response tokens only."""
    batch, truth = rollout_batch(1)
    padded, origin = pad_and_shuffle(batch, seed=2, copies=5)
    spec = estimator_spec(name, {}, invalid_penalty=PENALTY)
    got = spec.row_advantages(padded.non_tensor_batch)
    want = compute_advantages(name, truth_columns(truth), invalid_penalty=PENALTY)[origin]
    assert np.abs(got - want).max() <= 1e-6
    mask = padded.batch["response_mask"]
    tokens = token_advantages(got, mask)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.float32 and tokens.shape == mask.shape
    expected = torch.tensor(want, dtype=torch.float32)[:, None] * mask
    torch.testing.assert_close(tokens, expected, rtol=0, atol=1e-6)
    assert not tokens[mask == 0].any()
    np.testing.assert_allclose(token_advantages(got, mask.numpy()), tokens.numpy(), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_count_matches_the_estimator_with_each_copy_as_one_more_row(name):
    batch, truth = rollout_batch(3)
    padded, origin = pad_and_shuffle(batch, seed=4, copies=6)
    n = len(batch)
    spec = estimator_spec(name, {}, invalid_penalty=PENALTY, rows=RowOptions(duplicates="count"))
    got = spec.row_advantages(padded.non_tensor_batch)
    # the copies are the padded rows whose original appears earlier in the batch
    first = np.unique(origin, return_index=True)[1]
    copy_rows = np.setdiff1d(np.arange(origin.size), first)
    assert copy_rows.size == 6 and origin.size == n + 6
    reference = compute_advantages(
        name, with_copies_counted(truth, origin[copy_rows]), invalid_penalty=PENALTY
    )
    want = reference[origin]  # a copy takes its row's advantage, computed with the copies counted
    assert np.abs(got - want).max() <= 1e-6
    plain = compute_advantages(name, truth_columns(truth), invalid_penalty=PENALTY)[origin]
    assert np.abs(got - plain).max() > 1e-6  # the copies changed the statistics


def test_count_reproduces_verl_agents_gigpo_and_dedupe_does_not():
    """verl-agent's GiGPO counts copies; ``count`` gives its advantages where the copy's discounted return is
    its episode reward (copies of failed episodes or of last steps), ``dedupe`` does not."""
    gamma = 0.95
    batch, truth = rollout_batch(5, groups=6)
    batch.non_tensor_batch["progpo_returns"] = discounted_returns_in_play_order(batch, gamma)
    # copy rows whose discounted return equals the episode reward: the rows verl-agent and `count` agree on
    agree = np.flatnonzero(np.isclose(batch.non_tensor_batch["progpo_returns"], truth["episode_reward"]))
    rng = np.random.default_rng(6)
    copies = rng.choice(agree, 8, replace=False)
    padded = batch.concat(batch.select(copies))
    order = rng.permutation(len(padded))
    padded = padded.select(order)
    episode, step = verl_agent_gigpo(padded, gamma, step_weight=1.0)
    verl_agent = episode + step
    results = {}
    for duplicates in Duplicates:
        spec = estimator_spec(
            "gigpo",
            {"gamma": gamma, "norm": "mean_std"},
            invalid_penalty=PENALTY,
            rows=RowOptions(duplicates=duplicates),
        )
        results[duplicates] = spec.row_advantages(padded.non_tensor_batch)
    assert np.abs(results[Duplicates.COUNT] - verl_agent).max() <= 1e-6
    assert np.abs(results[Duplicates.DEDUPE] - verl_agent).max() > 1e-2
    # without copies both are verl-agent's GiGPO
    unpadded_episode, unpadded_step = verl_agent_gigpo(batch, gamma, step_weight=1.0)
    for duplicates in Duplicates:
        spec = estimator_spec("gigpo", {"gamma": gamma}, invalid_penalty=PENALTY, rows=RowOptions(duplicates))
        got = spec.row_advantages(batch.non_tensor_batch)
        assert np.abs(got - (unpadded_episode + unpadded_step)).max() <= 1e-6


def test_mean_norm_gigpo_is_verl_agents_too():
    batch, _ = rollout_batch(7)
    batch.non_tensor_batch["progpo_returns"] = discounted_returns_in_play_order(batch, 0.95)
    episode, step = verl_agent_gigpo(batch, 0.95, step_weight=0.5, with_std=False)
    spec = estimator_spec("gigpo", {"norm": "mean", "step_weight": 0.5}, invalid_penalty=PENALTY)
    assert np.abs(spec.row_advantages(batch.non_tensor_batch) - (episode + step)).max() <= 1e-6


def test_won_is_read_from_the_episode_reward_on_the_last_row():
    batch, truth = rollout_batch(8)
    padded, _ = pad_and_shuffle(batch, seed=9, copies=3)
    rows = estimator_rows(padded.non_tensor_batch)
    assert rows.copies == 3 and rows.columns["won"].sum() == truth["won"].sum() > 0
    last = rows.columns["step"] == np.array(
        [rows.columns["step"][rows.columns["traj_id"] == t].max() for t in rows.columns["traj_id"]]
    )
    assert not rows.columns["won"][~last].any()
    higher = estimator_rows(padded.non_tensor_batch, RowOptions(won_reward=11.0))
    assert not higher.columns["won"].any()


def test_missing_tags_and_wrong_tags_are_named():
    batch, _ = rollout_batch(10)
    columns = dict(batch.non_tensor_batch)
    del columns[STEP_COLUMN]
    with pytest.raises(ValueError, match=r"progpo_step.*install\(\)"):
        estimator_rows(columns)
    columns = dict(batch.non_tensor_batch)
    columns[STEP_COLUMN] = np.zeros(len(batch), dtype=np.int64)  # every row claims step 0
    with pytest.raises(ValueError, match="step tag does not identify rows"):
        estimator_rows(columns)
    with pytest.raises(ValueError, match="mismatched lengths"):
        estimator_rows({**batch.non_tensor_batch, ACTION_COLUMN: np.array(["look"], dtype=object)})


def test_rows_dropped_from_a_trajectory_are_an_error():
    """``adjust_batch(mode="delete")`` drops random rows; a trajectory with a hole cannot be estimated."""
    batch, truth = rollout_batch(11)
    drop = int(np.flatnonzero(truth["step"] == 1)[0])
    kept = batch.select(np.delete(np.arange(len(batch)), drop))
    spec = estimator_spec("progpo", {}, invalid_penalty=PENALTY)
    with pytest.raises(ValueError, match="contiguous steps"):
        spec.row_advantages(kept.non_tensor_batch)


def test_row_options_are_checked():
    with pytest.raises(ValueError, match="duplicates='twice'"):
        RowOptions(duplicates="twice")
    with pytest.raises(ValueError, match="won_reward"):
        RowOptions(won_reward=float("nan"))
    assert RowOptions(duplicates="count").duplicates is Duplicates.COUNT
