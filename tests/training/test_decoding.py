"""The continuously batched decoder: a response depends on its prompt and seed only (not on its batch, the
batch's capacity or when it joined), finished rows leave the batch, and inverse-CDF draws follow the
distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.training_helpers import sample_from
from training.constrained import ChoiceTrie
from training.decoding import DecodeBatch, inverse_cdf_draw
from training.policy import load_policy
from training.sampling import SampleRequest, pack_sequences, policy_logprobs


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    loaded = load_policy(tiny_policy_dir, device="cpu")
    loaded.model.eval()
    return loaded


def _prompts(tokenizer):
    texts = ["go to desk 1", "You are in the middle of a room. " * 4, "take mug", "look"]
    return [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for t in texts
    ]


def _sample(policy, prompts, seeds, batch_size, max_new_tokens=12, candidates=None):
    return sample_from(
        policy,
        prompts,
        max_new_tokens=max_new_tokens,
        seeds=seeds,
        batch_size=batch_size,
        candidates=candidates,
    )


def test_a_response_does_not_depend_on_its_batch(policy):
    prompts = _prompts(policy.tokenizer)
    alone = [_sample(policy, [p], [s], 1) for p, s in zip(prompts, [11, 12, 13, 14], strict=True)]
    together = _sample(policy, prompts, [11, 12, 13, 14], 4)
    # capacity 2: the last two join as the first ones finish (their caches merged mid-flight)
    staggered = _sample(policy, prompts, [11, 12, 13, 14], 2)
    for k, single in enumerate(alone):
        for batched in (together, staggered):
            assert batched.token_ids[k] == single.token_ids[0]
            np.testing.assert_allclose(batched.logprobs[k], single.logprobs[0], atol=1e-5)
    assert together.token_ids != _sample(policy, prompts, [1, 2, 3, 4], 4).token_ids  # the seeds matter


def test_requests_admitted_between_steps_match_the_trainer_forward(policy):
    """Rows that join a batch mid-decode (left padding of either side, retired rows trimmed) record the
    log-probs the trainer's one-pass forward computes."""
    prompts = _prompts(policy.tokenizer)
    batch = DecodeBatch(policy.model, policy.stop_token_ids, policy.tokenizer.pad_token_id, capacity=8)
    ids = [batch.add(SampleRequest(prompts[1], seed=5, temperature=1.0, max_new_tokens=20))]
    results = batch.step() + batch.step() + batch.step()
    ids += [
        batch.add(SampleRequest(p, seed=6 + k, temperature=0.7, max_new_tokens=9))
        for k, p in enumerate(prompts)
    ]
    results += batch.run()
    by_id = {r.request_id: r for r in results}
    assert sorted(by_id) == sorted(ids) and not batch.has_work()
    ordered = [by_id[i] for i in ids]
    all_prompts = [prompts[1], *prompts]
    temperatures = [1.0] + [0.7] * len(prompts)
    for prompt, result, temperature in zip(all_prompts, ordered, temperatures, strict=True):
        packed = pack_sequences([prompt], [result.token_ids], policy.tokenizer.pad_token_id)
        with torch.no_grad():
            trainer = policy_logprobs(policy.model, packed, [result.token_ids], [[]], temperature)[0]
        np.testing.assert_allclose(trainer.tolist(), result.logprobs, atol=2e-5)


def test_finished_rows_leave_the_batch(policy):
    prompts = _prompts(policy.tokenizer)
    batch = DecodeBatch(policy.model, policy.stop_token_ids, policy.tokenizer.pad_token_id, capacity=4)
    for k, p in enumerate(prompts):
        batch.add(SampleRequest(p, seed=k, temperature=1.0, max_new_tokens=1 + 5 * k))
    results = batch.run()
    assert [len(r.token_ids) for r in sorted(results, key=lambda r: r.request_id)] == [1, 6, 11, 16]
    # rows decoded = each row's own length: nothing was decoded as padding after its end
    assert batch.row_steps == 1 + 6 + 11 + 16 and batch.steps == 16


def test_constrained_responses_are_candidates_whatever_the_batch(policy):
    tok = policy.tokenizer
    prompts = _prompts(tok)
    options = [
        [
            tok(f"<action>{a}</action>", add_special_tokens=False)["input_ids"] + [policy.stop_token_ids[0]]
            for a in actions
        ]
        for actions in (
            ["go to desk 1", "look"],
            ["take mug 1", "open drawer 2", "look"],
            ["inventory"],
            ["go to bed 1", "go to desk 2"],
        )
    ]
    alone = [
        _sample(policy, [p], [s], 1, candidates=[c])
        for p, s, c in zip(prompts, [3, 4, 5, 6], options, strict=True)
    ]
    together = _sample(policy, prompts, [3, 4, 5, 6], 2, candidates=options)
    for k, single in enumerate(alone):
        assert together.token_ids[k] == single.token_ids[0]
        assert together.token_ids[k] in options[k] and together.finished[k]
        np.testing.assert_allclose(together.logprobs[k], single.logprobs[0], atol=1e-5)
    assert ChoiceTrie(options[2]).allowed(together.token_ids[2]) == []  # the only candidate, whole


def test_inverse_cdf_draws_follow_the_distribution():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]])
    rng = np.random.default_rng(0)
    draws = [
        int(inverse_cdf_draw(probs, torch.tensor([rng.random()], dtype=torch.float64))) for _ in range(20000)
    ]
    counts = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(counts, [0.1, 0.0, 0.6, 0.3], atol=0.015)
    assert counts[1] == 0.0
