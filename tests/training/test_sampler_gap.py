"""The sampler–trainer gap (``sampler_logprob_gap_mean``/``_max``) and its bound
(``rollout.max_sampler_logprob_gap``): a sampler whose weights are frozen on purpose (a broken weight sync)
stops the run with one line naming the likely cause; the same sampler synced after every update passes."""

from __future__ import annotations

import copy
import json

import pytest

from tests.training.training_helpers import tiny_config
from training.engines import TransformersEngine
from training.trainer import Trainer
from training.update import SamplerGapError

BOUND = 1e-3  # fp32 sampling and training on the CPU agree to ~1e-7 per token


def _trainer_with_a_sampler_copy(tmp_path, frozen: bool) -> Trainer:
    config = tiny_config(
        tmp_path,
        "iterations=3",
        "warm_start.enabled=false",
        "eval.before_rl=false",
        "eval.num_tasks=0",
        "algo.recompute_old_logprobs=true",
        "optim.lr=1e-2",
        f"rollout.max_sampler_logprob_gap={BOUND}",
    )
    trainer = Trainer(config)
    sampler = copy.deepcopy(trainer.model)
    trainer.engine = TransformersEngine(
        sampler, trainer.policy.stop_token_ids, trainer.tokenizer.pad_token_id
    )
    trainer.sampler_is_copy = True  # as under torchrun or with vLLM: every update is synced into the copy
    if frozen:
        trainer.engine.sync_weights = lambda model: None  # the broken sync: the copy keeps the first weights
    return trainer


def test_a_frozen_sampler_fails_the_gap_check(tmp_path):
    trainer = _trainer_with_a_sampler_copy(tmp_path, frozen=True)
    try:
        with pytest.raises(SamplerGapError, match="weight sync") as raised:
            trainer.run()
    finally:
        trainer.close()
    assert "\n" not in str(raised.value) and "rollout.max_sampler_logprob_gap" in str(raised.value)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in records if r["kind"] == "train"]
    assert len(first) == 1 and first[0]["sampler_logprob_gap_mean"] < BOUND  # the first rollout was on-policy


def test_a_synced_sampler_passes_and_logs_the_gap(tmp_path):
    trainer = _trainer_with_a_sampler_copy(tmp_path, frozen=False)
    try:
        trainer.run()
    finally:
        trainer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 3
    for r in train:
        assert 0 <= r["sampler_logprob_gap_mean"] <= r["sampler_logprob_gap_max"] < BOUND, r
        assert r["params_changed_frac"] > 0.5  # the weights did move between rollouts
