"""Infrastructure faults never become training signal (issue 38, item 4): a group that a lost env server cut
short (an episode ended with ``info["env_error"]``) is left out of the advantages, the loss and the success,
and counted in ``env_failed_episodes``; a run without env failures trains exactly as before."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from tests.training.training_helpers import subprocess_env, tiny_trainer
from training.advantages import compute_advantages
from training.metrics import train_metrics
from training.rollout import RolloutResult, StepRows, collect_groups
from training.update import make_optimizer, rows_to_train, step_advantages

#: A bare iteration (no warm start, no evaluation), 3 groups of 3 copies.
BARE = ("warm_start.enabled=false", "eval.num_tasks=0", "rollout.num_groups=3", "rollout.group_size=3")
#: The training toy env under a hostable id (env servers host ``progpo/*`` ids only).
HOSTED_ID = "progpo/ToyALFWorldTraining-v0"


def _rollout(trainer, iteration: int = 0) -> RolloutResult:
    return collect_groups(trainer.rollout_worker, trainer.engine, trainer.config, iteration, trainer.dist)


def _advantages_before_issue_38(result: RolloutResult, algo) -> np.ndarray:
    """What the trainer computed before: the estimator on every row of the batch."""
    columns = result.rows.estimator_columns()
    return compute_advantages(algo.name, columns, invalid_penalty=algo.invalid_penalty, **algo.params)


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _lose(result: RolloutResult, group: int) -> RolloutResult:
    """``result`` as the rollout records it when ``group``'s env server is lost under its first copy's
    episode (its last step returned ``info["env_error"]``: :class:`training.rollout.RolloutRecorder`)."""
    episodes = list(result.episodes)
    first = next(i for i, e in enumerate(episodes) if e.group_id == group)
    episodes[first] = dataclasses.replace(episodes[first], won=False, env_error="server lost (test)")
    return dataclasses.replace(result, episodes=episodes)


def test_a_run_without_env_failures_trains_bit_for_bit_as_before(tmp_path):
    """The same iteration from the same weights: the trainer's (the env-failure code engaged, finding none)
    and the one before this change (the estimator on every row, every row trained) end on identical weights
    and identical update statistics."""
    with (
        tiny_trainer(tmp_path / "now", *BARE) as now,
        tiny_trainer(tmp_path / "before", *BARE) as before,
    ):
        start = _parameters(now.model)
        assert all(torch.equal(start[k], v) for k, v in _parameters(before.model).items())
        metrics = now.train_iteration(0)

        result = _rollout(before)
        assert not any(e.env_error for e in result.episodes) and result.rows.num_rows > 0
        np.testing.assert_array_equal(  # the same advantages, bit for bit
            step_advantages(result, before.config.algo),
            _advantages_before_issue_38(result, before.config.algo),
        )
        assert rows_to_train(result, exclude_uniform_groups=False).all()
        advantages = _advantages_before_issue_38(result, before.config.algo)
        kept = np.ones(result.rows.num_rows, dtype=bool)
        stats = before.update(result.rows, advantages, 0, kept, np.zeros(result.rows.num_rows, dtype=bool))
        after_now, after_before = _parameters(now.model), _parameters(before.model)
    assert any(not torch.equal(start[k], after_now[k]) for k in start)  # the update moved the weights
    assert all(torch.equal(after_now[k], after_before[k]) for k in start)
    for key in ("pg_loss", "kl", "entropy", "grad_norm", "update_tokens"):
        assert metrics[key] == stats[key], key
    assert metrics["env_failed_episodes"] == 0.0 and metrics["episodes"] == 9.0


def test_an_env_failed_group_has_no_advantage_no_loss_and_no_success(tmp_path):
    """Group 1 lost its server under one episode: its rows get advantage 0 and no weight (whatever they hold,
    the update lands on the same weights), the other groups' advantages are the estimator's on their rows
    alone, and the iteration's metrics count the lost episode apart and score the other groups only."""
    # the scrambled log-probs below are far from the policy's: the sampler check would stop the update
    with tiny_trainer(tmp_path, *BARE, "rollout.max_sampler_logprob_gap=0") as trainer:
        cfg = trainer.config
        result = _lose(_rollout(trainer), group=1)
        lost = np.asarray(result.rows.group_id) == 1
        assert lost.any() and (~lost).any()
        np.testing.assert_array_equal(result.env_failed_rows(), lost)

        advantages = step_advantages(result, cfg.algo)
        assert (advantages[lost] == 0).all()
        healthy = dataclasses.replace(result, rows=result.rows.select(np.flatnonzero(~lost).tolist()))
        np.testing.assert_array_equal(advantages[~lost], _advantages_before_issue_38(healthy, cfg.algo))
        kept = rows_to_train(result, exclude_uniform_groups=False)
        np.testing.assert_array_equal(kept, ~lost)
        assert not rows_to_train(result, exclude_uniform_groups=True)[lost].any()  # DAPO's too

        start = _parameters(trainer.model)

        def update(rows: StepRows) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
            with torch.no_grad():
                for name, p in trainer.model.named_parameters():
                    p.copy_(start[name])
            trainer.optimizer = make_optimizer(trainer.model, cfg.optim)
            stats = trainer.update(rows, advantages, 0, kept)
            return _parameters(trainer.model), stats

        def scrambled(rows: StepRows, where: np.ndarray) -> StepRows:
            """``rows`` with other responses and behaviour log-probs at ``where``."""
            rows = dataclasses.replace(rows, response_ids=list(rows.response_ids))
            rows.old_logprobs = list(rows.old_logprobs)
            for i in np.flatnonzero(where):
                rows.response_ids[i] = [(t * 7 + 3) % 2000 for t in rows.response_ids[i]]
                rows.old_logprobs[i] = [lp - 0.5 for lp in rows.old_logprobs[i]]
            return rows

        weights, stats = update(result.rows)
        assert stats["update_tokens"] == sum(len(result.rows.response_ids[i]) for i in np.flatnonzero(kept))
        scrambled_lost, _ = update(scrambled(result.rows, lost))
        assert all(torch.equal(weights[k], scrambled_lost[k]) for k in start)  # zero weight
        scrambled_kept, _ = update(scrambled(result.rows, ~lost))  # the check can see a change
        assert any(not torch.equal(weights[k], scrambled_kept[k]) for k in start)

        marks = dict.fromkeys(("start", "rollout", "advantages", "update", "sync"), 0.0)
        staleness = np.zeros(result.rows.num_rows, dtype=np.int64)
        metrics = train_metrics(0, result, advantages, stats, staleness, marks, trainer.dist, cfg.rollout)
    assert metrics["env_failed_episodes"] == 1.0
    scored = [e for e in result.episodes if e.group_id != 1]
    assert metrics["episodes"] == len(scored) == 6.0
    assert metrics["success"] == np.mean([e.won for e in scored])


def test_dynamic_sampling_drops_an_env_failed_group_and_still_counts_it(tmp_path, monkeypatch):
    """DAPO's dynamic sampling rolls more rounds in place of the groups it drops: an env-failed group is one
    of them (never kept, however mixed its outcomes), and its lost episode is still counted."""
    dapo = (
        "rollout.dynamic_sampling=true",
        "rollout.max_sampling_rounds=2",
        "loss.exclude_uniform_groups=true",
    )
    with tiny_trainer(tmp_path, *BARE, *dapo) as trainer:
        worker, play = trainer.rollout_worker, trainer.rollout_worker.run
        rounds = []

        def run_losing_group_0_of_round_0(**kwargs) -> RolloutResult:
            result = play(**kwargs)
            rounds.append(result)
            return _lose(result, group=0) if len(rounds) == 1 else result

        monkeypatch.setattr(worker, "run", run_losing_group_0_of_round_0)
        result = _rollout(trainer)
        kept = rows_to_train(result, exclude_uniform_groups=True)
        advantages = step_advantages(result, trainer.config.algo)
        stats = {"update_tokens": 0.0}
        marks = dict.fromkeys(("start", "rollout", "advantages", "update", "sync"), 0.0)
        staleness = np.zeros(result.rows.num_rows, dtype=np.int64)
        metrics = train_metrics(
            0, result, advantages, stats, staleness, marks, trainer.dist, trainer.config.rollout
        )
    assert len(rounds) == 2  # group 0 of round 0 could not fill the batch
    assert not kept[np.asarray(result.rows.group_id) == 0].any()  # absent, or left out of the loss
    assert result.groups_dropped >= 1 and metrics["rollout_groups_dropped"] >= 1
    assert metrics["env_failed_episodes"] == 1.0
    assert [e.env_error for e in result.episodes if e.group_id == 0] == ["server lost (test)"]


class _LoseServerAtFirstStep:
    """The trainer's engine, stopping ``server`` when it is first asked for responses: after the groups were
    reset on the servers, before their first step."""

    def __init__(self, engine, server):
        self.engine, self.server = engine, server

    def generate(self, *args, **kwargs):
        if self.server is not None:
            self.server.stop()
            self.server = None
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_lost_env_server_s_groups_are_not_trained_on(tmp_path, monkeypatch):
    """Two env servers, the second stopped under its groups' first step: the fleet ends their episodes with
    ``env_error``; the iteration trains on the first server's groups alone and counts the others' episodes in
    ``env_failed_episodes`` (before: they were trained on as failed episodes, reward 0)."""
    from progpo_envs.core.registration import register_text_env
    from progpo_envs.server.app import ServerConfig, create_app
    from progpo_envs.server.policy import default_allowed_kwargs
    from progpo_envs.server.pool import PoolConfig
    from progpo_envs.server.serving import BackgroundServer

    register_text_env(HOSTED_ID, "progpo_envs.testing:DrawerEnv")
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # env workers import the toy env
    allowed = default_allowed_kwargs("progpo_envs.testing:DrawerEnv")
    config = ServerConfig(env_ids=(HOSTED_ID,), allowed_kwargs={HOSTED_ID: allowed}, pool=PoolConfig(1))
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(BackgroundServer(create_app(config)))
        second = BackgroundServer(create_app(config)).__enter__()
        lose = _LoseServerAtFirstStep(None, second)
        stack.callback(lambda: lose.server and lose.server.stop())
        urls = f"env.url={first.url},{second.url}"
        trainer = stack.enter_context(
            tiny_trainer(
                tmp_path, "warm_start.enabled=false", "eval.num_tasks=0", urls, f"env.id={HOSTED_ID}"
            )
        )
        lose.engine, trainer.engine = trainer.engine, lose
        updates, update = [], trainer.update

        def recorded_update(*args):
            updates.append(args)
            return update(*args)

        monkeypatch.setattr(trainer, "update", recorded_update)
        metrics = trainer.train_iteration(0)
    rows, advantages, _, kept = updates[0][:4]
    lost = np.asarray(rows.group_id) == 1  # groups go to the servers in order: group 1 to the second
    assert lost.any() and (~lost).any()
    assert {rows.step[i] for i in np.flatnonzero(lost)} == {0}  # its episodes ended at their first step
    np.testing.assert_array_equal(kept, ~lost)
    assert (advantages[lost] == 0).all()
    healthy = RolloutResult(rows.select(np.flatnonzero(~lost).tolist()), [])
    np.testing.assert_array_equal(
        advantages[~lost], _advantages_before_issue_38(healthy, trainer.config.algo)
    )
    tokens = sum(len(rows.response_ids[i]) for i in np.flatnonzero(~lost))
    assert metrics["update_tokens"] == tokens * trainer.config.loss.ppo_epochs
    groups = trainer.config.rollout.group_size
    assert metrics["server/1/failed_episodes"] == groups  # the second server held one group
    assert metrics["env_failed_episodes"] == groups
    assert metrics["episodes"] == groups * (trainer.config.rollout.num_groups - 1)
