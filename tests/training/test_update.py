"""The update's micro-step: gradient accumulation over micro-batches equals one pass over the mini-batch, and
the metrics are token means of the micro-steps' sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.config import LossConfig
from training.policy import load_policy
from training.rollout import StepRows
from training.update import Numerics, UpdateMetrics, micro_step, pack_micro_batch, recompute_old_logprobs

#: The update's numerics on the CPU in float32 (the quickstart's).
NUMERICS = Numerics(torch.device("cpu"))


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    return load_policy(tiny_policy_dir, device="cpu")


def _rows(rng: np.random.Generator) -> StepRows:
    """Four step rows of random prompts and responses, with made-up sampling log-probs."""
    rows = StepRows.empty()
    for length in (3, 5, 2, 4):
        rows.prompt_ids.append(rng.integers(10, 2000, size=int(rng.integers(4, 9))).tolist())
        rows.response_ids.append(rng.integers(10, 2000, size=length).tolist())
        rows.old_logprobs.append((-rng.uniform(5, 9, size=length)).tolist())
        rows.choices.append([])
    return rows


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]


def test_micro_batches_accumulate_the_mini_batch_gradient(policy):
    model, pad = policy.model, policy.tokenizer.pad_token_id
    rows = _rows(np.random.default_rng(0))
    advantages = np.array([1.0, -0.5, 0.25, -2.0])
    loss = LossConfig(kl_coef=0.0, entropy_coef=0.01)
    tokens = float(sum(len(r) for r in rows.response_ids))
    model.train()

    model.zero_grad(set_to_none=True)
    whole = pack_micro_batch(rows, advantages, [0, 1, 2, 3], pad, "cpu")
    whole_terms = micro_step(model, None, whole, loss, 1.0, 1.0 / tokens, NUMERICS)
    whole_grads = _grads(model)

    model.zero_grad(set_to_none=True)
    metrics = UpdateMetrics()
    for part in ([0, 1], [2, 3]):  # gradient accumulation: each part's share of the token mean
        batch = pack_micro_batch(rows, advantages, part, pad, "cpu")
        terms = micro_step(model, None, batch, loss, 1.0, 1.0 / tokens, NUMERICS)
        metrics.add_micro_step(batch, terms, first_epoch=True, before_first_step=True)
    accumulated = _grads(model)

    assert len(accumulated) == len(whole_grads) > 0
    for a, b in zip(whole_grads, accumulated, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    summary = metrics.summary()
    assert summary["update_tokens"] == tokens
    assert summary["pg_loss"] == pytest.approx(float(whole_terms.policy.pg_sum.detach()) / tokens, rel=1e-4)
    assert summary["entropy"] == pytest.approx(float(whole_terms.entropy_sum.detach()) / tokens, rel=1e-4)
    # the first check compares the trainer with the sampler on the first micro-batch only
    assert summary["logprob_diff_max"] > 0 and summary["grad_norm"] == 0.0


def test_micro_step_with_reference_adds_the_kl_term(policy):
    model, pad = policy.model, policy.tokenizer.pad_token_id
    rows = _rows(np.random.default_rng(1))
    batch = pack_micro_batch(rows, np.zeros(4), [0, 1, 2, 3], pad, "cpu")
    model.zero_grad(set_to_none=True)
    without = micro_step(model, None, batch, LossConfig(kl_coef=0.1), 1.0, 0.0, NUMERICS)
    with_self = micro_step(model, model, batch, LossConfig(kl_coef=0.1), 1.0, 0.0, NUMERICS)
    assert float(without.kl_sum) == 0.0
    # the policy is its own reference here: k3 KL of identical distributions is zero up to rounding
    assert abs(float(with_self.kl_sum)) < 1e-4
    assert with_self.logprobs.shape == batch.mask.shape and not with_self.logprobs.requires_grad


def test_recomputed_old_logprobs_make_the_first_ratio_exactly_one_in_bf16(policy):
    """pi_old recomputed over the first epoch's micro-batches, in the update's own bf16 path, equals the first
    pass bit for bit (ratio 1 on every token); the sampler's recorded log-probs do not."""
    model, pad = policy.model, policy.tokenizer.pad_token_id
    rows = _rows(np.random.default_rng(2))
    bf16 = Numerics(torch.device("cpu"), torch.bfloat16, chunk_tokens=2)
    micro_batches = [([0, 1], 1.0), ([2, 3], 1.0)]
    model.train()
    old = recompute_old_logprobs(model, rows, micro_batches, pad, 1.0, bf16)
    assert [len(lp) for lp in old] == [len(r) for r in rows.response_ids]
    for recomputed, label in ((old, "recomputed"), (None, "sampler")):
        metrics = UpdateMetrics()
        for micro, _weight in micro_batches:
            batch = pack_micro_batch(rows, np.ones(4), micro, pad, "cpu", recomputed)
            terms = micro_step(model, None, batch, LossConfig(kl_coef=0.0), 1.0, 0.0, bf16)
            metrics.add_micro_step(batch, terms, first_epoch=True, before_first_step=True)
        summary = metrics.summary()
        if label == "recomputed":
            assert summary["first_ratio_max_abs_dev"] == 0.0 and summary["first_ratio_mean_abs_dev"] == 0.0
        else:  # the made-up sampling log-probs are far from the model's
            assert summary["first_ratio_max_abs_dev"] > 1.0


def test_zero_weight_passes_do_not_overwrite_a_rows_recomputed_old_logprobs(policy):
    """A pass that only keeps ranks in step (weight 0) runs its forward but records nothing: the row keeps
    pi_old from its own micro-batch (here: the recorded one, as no real micro-batch covers row 3)."""
    model, pad = policy.model, policy.tokenizer.pad_token_id
    rows = _rows(np.random.default_rng(3))
    numerics = Numerics(torch.device("cpu"))
    old = recompute_old_logprobs(model, rows, [([0, 1, 2], 1.0), ([3], 0.0)], pad, 1.0, numerics)
    assert old[3] == list(rows.old_logprobs[3])
    assert old[0] != list(rows.old_logprobs[0])  # the real micro-batch was recomputed
