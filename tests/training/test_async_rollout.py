"""Asynchronous rollouts (``rollout.mode=async``): at ``max_staleness=0`` they reproduce the lock-step groups,
episodes and first update; at 1 the next batch rolls out during the update, within the bound, and the loss
corrects the stale rows."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
import torch

from tests.training.training_helpers import tiny_config, tiny_qwen2
from training.async_rollout import AsyncRollout
from training.engine_loop import EngineLoop
from training.rollout import StepRows, collect_groups
from training.trainer import Trainer

#: The quickstart's own decoding (constrained) and the papers' (free text).
DECODING = {"constrained": ["rollout.constrained_actions=true"], "free text": []}
#: Fields of a step row that must be equal in both modes (the log-probs: to float rounding).
EXACT_ROW_FIELDS = [f.name for f in dataclasses.fields(StepRows) if f.name != "old_logprobs"]


def _config(tmp_path, name, *overrides):
    return tiny_config(
        tmp_path / name,
        "warm_start.enabled=false",
        "eval.before_rl=false",
        "eval.num_tasks=0",
        "checkpoint_every=0",
        "env.max_steps=5",
        "rollout.num_groups=3",
        "rollout.group_size=3",
        *overrides,
    )


@pytest.mark.parametrize("decoding", sorted(DECODING))
def test_async_rollout_at_staleness_0_plays_the_lockstep_batch(tmp_path, decoding):
    """Same groups, tasks, seeds, responses, rewards and episode outcomes, rows in the same order."""
    lockstep = Trainer(_config(tmp_path, "lockstep", *DECODING[decoding]))
    asynchronous = Trainer(_config(tmp_path, "async", *DECODING[decoding], "rollout.mode=async"))
    try:
        assert isinstance(asynchronous.engine, EngineLoop)
        for iteration in (0, 3):
            expected = collect_groups(
                lockstep.rollout_worker, lockstep.engine, lockstep.config, iteration, lockstep.dist
            )
            asynchronous.engine.set_version(iteration)
            rollout = AsyncRollout(
                asynchronous.config, asynchronous.tokenizer, asynchronous.engine, asynchronous.dist, iteration
            )
            try:
                got = rollout.collect(iteration)
            finally:
                rollout.close()
            assert got.rows.num_rows == expected.rows.num_rows > 0
            for name in EXACT_ROW_FIELDS:
                assert getattr(got.rows, name) == getattr(expected.rows, name), name
            for a, b in zip(got.rows.old_logprobs, expected.rows.old_logprobs, strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5)
            assert got.episodes == expected.episodes
            assert got.generated_tokens == expected.generated_tokens
            assert set(got.rows.policy_version) == {iteration}
    finally:
        lockstep.close()
        asynchronous.close()


def _train_records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_async_training_at_staleness_0_repeats_the_lockstep_run(tmp_path):
    """``rollout.mode=async rollout.max_staleness=0`` with a fixed seed on the CPU transformers engine: the
    same groups, episodes and updates in metrics.jsonl as ``rollout.mode=lockstep``."""
    runs = {}
    for mode in ("lockstep", "async"):
        trainer = Trainer(
            _config(
                tmp_path,
                mode,
                "iterations=2",
                "rollout.constrained_actions=true",
                f"rollout.mode={mode}",
                "tensorboard=true",
            )
        )
        try:
            trainer.run()
        finally:
            trainer.close()
        runs[mode] = _train_records(tmp_path / mode)
    assert len(runs["lockstep"]) == len(runs["async"]) == 2
    for lock, asy in zip(runs["lockstep"], runs["async"], strict=True):
        for key in ("rows", "success", "episode_steps", "episodes", "update_tokens", "optimizer_steps"):
            assert asy[key] == lock[key], key
        for key in ("pg_loss", "kl", "entropy", "grad_norm", "advantage_mean"):
            assert asy[key] == pytest.approx(lock[key], rel=1e-5, abs=1e-8), key
        assert asy["staleness/0"] == lock["staleness/0"] == 1.0
        assert "engine_busy_frac" in asy and "rollout_update_overlap" in asy
    # TensorBoard shows the staleness and overlap metrics beside the rest
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "async" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/staleness/0", "train/staleness_mean", "train/rollout_update_overlap"} <= tags
    assert {"train/engine_busy_frac", "train/rollout_groups_dropped"} <= tags


def test_staleness_1_overlaps_the_update_and_stays_within_the_bound(tmp_path):
    """With max_staleness 1 the next batch is sampled by the previous policy while the update runs: rows are
    at most one version behind, the stale ones are reweighted, and the run learns on as usual."""
    config = _config(
        tmp_path,
        "stale",
        "iterations=3",
        "rollout.constrained_actions=true",
        "rollout.mode=async",
        "rollout.max_staleness=1",
    )
    trainer = Trainer(config)
    try:
        assert trainer.sampler_is_copy  # rollouts must not read weights the optimizer is changing
        trainer.run()
    finally:
        trainer.close()
    records = _train_records(tmp_path / "stale")
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert all(r["staleness_max"] <= 1 for r in records)
    assert records[0]["staleness/1"] == 0.0  # nothing older than the first policy exists
    # batches 2 and 3 were admitted one version early (at the latest while the previous update ran)
    stale = [r for r in records[1:] if r["staleness/1"] > 0]
    assert stale, [r["staleness/1"] for r in records]
    for r in stale:
        assert r["stale_tokens"] > 0 and 0 < r["behaviour_weight_mean"] <= config.loss.behaviour_weight_cap
        assert np.isfinite(r["pg_loss"])


def test_stale_rows_are_reweighted_and_current_rows_are_not(tmp_path):
    """The update at max_staleness 0 is the on-policy update exactly; marking rows stale changes their loss
    by the truncated behaviour weights (which need the proximal log-probs recomputed)."""
    from training.update import behaviour_weights

    trainer = Trainer(_config(tmp_path, "update", "rollout.constrained_actions=true"))
    try:
        result = collect_groups(trainer.rollout_worker, trainer.engine, trainer.config, 0, trainer.dist)
        rows = result.rows
        advantages = np.linspace(-1.0, 1.0, rows.num_rows)
        kept = np.ones(rows.num_rows, dtype=bool)
        state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        optimizer_state = trainer.optimizer.state_dict()

        def update(stale):
            trainer.model.load_state_dict(state)
            trainer.optimizer.load_state_dict(optimizer_state)
            return trainer.update(rows, advantages, 0, kept, stale)

        none = update(np.zeros(rows.num_rows, dtype=bool))
        again = update(np.zeros(rows.num_rows, dtype=bool))
        assert none == again  # deterministic
        assert "behaviour_weight_mean" not in none  # nothing stale: no correction, no recompute
        # perturb the recorded behaviour log-probs of half the rows, as an older policy would have
        stale = np.arange(rows.num_rows) % 2 == 0
        original = [list(lp) for lp in rows.old_logprobs]
        for i in np.flatnonzero(stale):
            rows.old_logprobs[i] = [lp - 0.3 for lp in rows.old_logprobs[i]]
        marked = update(stale)
        weights = behaviour_weights(
            rows.old_logprobs, original, stale, trainer.config.loss.behaviour_weight_cap
        )
        assert marked["behaviour_weight_mean"] == pytest.approx(
            np.mean([w for row in weights if row is not None for w in row]), rel=1e-4
        )
        assert marked["pg_loss"] != pytest.approx(none["pg_loss"], rel=1e-6)
        # the ratio is clipped against the recomputed proximal policy: it starts at 1 on every row
        assert marked["first_ratio_max_abs_dev"] < 1e-4
    finally:
        trainer.close()


def test_weights_of_a_sync_reach_the_stale_sampler_only_after_it_drained():
    """The engine loop drains before a weight sync: no response mixes two policies."""
    from transformers import Qwen2ForCausalLM

    from training.engines import TransformersEngine
    from training.sampling import SampleRequest

    shape = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    sampler = tiny_qwen2(**shape, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    trained = Qwen2ForCausalLM(sampler.config)  # the next draws of the same seeded generator
    sampler.eval()
    loop = EngineLoop(TransformersEngine(sampler, stop_token_ids=[0], pad_token_id=0, batch_size=4))
    try:
        long = loop.submit(SampleRequest([1, 2, 3], seed=1, temperature=1.0, max_new_tokens=200))
        while not loop.in_flight:  # until it is being decoded
            time.sleep(0.001)
        loop.sync_weights(trained, version=1)
        assert long.done()  # the sync waited for it
        after = loop.submit(SampleRequest([1, 2, 3], seed=2, temperature=1.0, max_new_tokens=3))
        assert long.result().policy_version == 0 and after.result().policy_version == 1
        assert torch.equal(sampler.lm_head.weight, trained.lm_head.weight.detach())
    finally:
        loop.close()
