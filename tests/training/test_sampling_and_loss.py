"""Sampler/trainer log-prob parity, response-only masking, and the PPO loss terms."""

from __future__ import annotations

import math

import pytest
import torch

from tests.training.training_helpers import sample_from
from training.loss import kl_k3, policy_loss_terms
from training.policy import load_policy
from training.sampling import pack_sequences, response_logits, token_logprobs_and_entropy


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    return load_policy(tiny_policy_dir, device="cpu")


def _prompts(tokenizer):
    texts = [
        "Your task is to: put a mug in the sink.",
        "go to desk 1",
        "You are in the middle of a room. " * 3,
    ]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
        )
        for t in texts
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.4])
def test_sampler_logprobs_match_trainer_forward(policy, temperature):
    tok = policy.tokenizer
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok)]
    out = sample_from(
        policy,
        prompts,
        max_new_tokens=10,
        temperature=temperature,
        seeds=[3, 4, 5],
        batch_size=2,
    )
    assert [len(r) for r in out.token_ids] == [len(lp) for lp in out.logprobs]
    packed = pack_sequences(prompts, out.token_ids, tok.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(
            response_logits(policy.model, packed, temperature), packed.response_ids
        )
    mask = packed.response_mask.bool()
    old = torch.zeros_like(logprobs)
    for row, lp in enumerate(out.logprobs):
        old[row, : len(lp)] = torch.tensor(lp)
    assert torch.allclose(logprobs[mask], old[mask], atol=2e-5)
    terms = policy_loss_terms(
        logprobs, old, torch.ones_like(old), mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0
    )
    assert terms.ratio_sum.item() / mask.sum().item() == pytest.approx(1.0, abs=1e-5)  # first-step ratio = 1
    assert terms.clipped_sum.item() == 0


def test_sampling_is_reproducible_from_the_seeds(policy):
    tok = policy.tokenizer
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok)]
    runs = [sample_from(policy, prompts, max_new_tokens=8, seeds=[7, 8, 9]).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_packing_places_only_response_tokens_under_the_mask():
    prompts, responses = [[5, 6, 7], [8]], [[1, 2], [3, 4, 9]]
    packed = pack_sequences(prompts, responses, pad_token_id=0)
    assert packed.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert packed.response_ids.tolist() == [[1, 2, 0], [3, 4, 9]]
    width = packed.response_ids.shape[1]
    assert packed.input_ids[:, -width:].tolist() == packed.response_ids.tolist()
    assert packed.input_ids[:, :-width].tolist() == [[5, 6, 7], [0, 0, 8]]  # prompts left-padded before them


def test_loss_ignores_everything_outside_the_response_mask(policy):
    tok = policy.tokenizer
    prompts = [tok("look around", add_special_tokens=False)["input_ids"], [1, 2, 3, 4, 5, 6]]
    packed = pack_sequences(prompts, [[10, 11, 12], [13]], tok.pad_token_id)
    mask = packed.response_mask
    logprobs, _ = token_logprobs_and_entropy(response_logits(policy.model, packed), packed.response_ids)
    old = logprobs.detach() - 0.1
    adv = torch.ones_like(old)
    base = policy_loss_terms(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0).pg_sum
    garbage_old, garbage_adv = old.clone(), adv.clone()
    garbage_old[mask == 0] = 50.0
    garbage_adv[mask == 0] = -1e6
    other = policy_loss_terms(
        logprobs, garbage_old, garbage_adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0
    ).pg_sum
    assert other.item() == pytest.approx(base.item())
    # gradient reaches the embeddings of the response tokens' predictors, never the padded row tail
    base.backward()
    assert policy.model.model.embed_tokens.weight.grad is not None


def test_clip_and_dual_clip_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 5.0, 0.5]]))
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones_like(logp)
    terms = policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # token 1: A>0, rho=1.5 -> max(-1.5, -1.2) = -1.2 (clipped); token 2: A>0, rho=0.5 -> max(-0.5, -0.8) =
    # -0.5;
    # token 3: A<0, rho=5 -> max(5, 1.2) = 5 -> dual clip min(5, 3) = 3; token 4: A<0, rho=0.5 -> max(0.5,
    # 0.8) = 0.8
    assert terms.pg_sum.item() == pytest.approx(-1.2 - 0.5 + 3.0 + 0.8)
    assert terms.clipped_sum.item() == 2 and terms.dual_clipped_sum.item() == 1
    no_dual = policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=0.0)
    assert no_dual.pg_sum.item() == pytest.approx(-1.2 - 0.5 + 5.0 + 0.8)


def test_clip_higher_is_asymmetric():
    logp = torch.log(torch.tensor([[1.5]]))
    terms = policy_loss_terms(
        logp,
        torch.zeros_like(logp),
        torch.ones_like(logp),
        torch.ones_like(logp),
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=0.0,
    )
    assert terms.pg_sum.item() == pytest.approx(-1.28)


def test_k3_kl():
    assert kl_k3(torch.tensor([-2.0]), torch.tensor([-2.0])).item() == 0.0
    value = kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])).item()
    assert value == pytest.approx(0.5 - math.log(0.5) - 1)
    assert value > 0
    assert kl_k3(torch.tensor([0.0]), torch.tensor([-100.0])).item() <= 10.0  # clamped


def test_corpus_nll_is_the_full_softmax_renormalised_over_the_corpus_tokens(policy):
    """The warm start's language-model stage: every token after the first is predicted once, from the logits
    of the corpus' own tokens only (the full softmax restricted to them and renormalised); padding is
    outside the mask."""
    from training.warm_start import corpus_nll_sum

    model, tokenizer = policy.model, policy.tokenizer
    texts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in _prompts(tokenizer)]
    vocab = torch.tensor(sorted({t for text in texts for t in text}))
    with torch.no_grad():
        loss_sum, mask = corpus_nll_sum(model, texts, vocab, tokenizer.pad_token_id, "cpu")
    assert mask.sum(1).tolist() == [len(t) - 1 for t in texts]
    expected = 0.0
    with torch.no_grad():
        for text in texts:
            logits = model(torch.tensor([text])).logits[0, :-1, vocab]
            logprobs = torch.log_softmax(logits.float(), -1)
            column = torch.searchsorted(vocab, torch.tensor(text[1:]))
            expected -= float(logprobs.gather(-1, column[:, None]).sum())
    assert float(loss_sum) == pytest.approx(expected, rel=1e-4)
