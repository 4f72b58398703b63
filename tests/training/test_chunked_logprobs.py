"""Chunked log-probs/entropy (``optim.logit_chunk_tokens``): the unchunked values and gradients, in bounded
memory; on one process and on an FSDP2 model over 2 gloo ranks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.fsdp_chunked_worker import objective as _objective
from tests.training.fsdp_chunked_worker import tiny_batch as _batch
from tests.training.training_helpers import subprocess_env, tiny_qwen2
from training.sampling import (
    chunked_logprobs_and_entropy,
    policy_logprobs,
    policy_logprobs_and_entropy,
    response_hidden_states,
    response_logits,
    token_logprobs_and_entropy,
)


def _unchunked(model, packed, temperature):
    return token_logprobs_and_entropy(response_logits(model, packed, temperature), packed.response_ids)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_values_and_gradients_equal_the_full_logits(chunk_tokens, temperature):
    model = tiny_qwen2()
    packed, responses = _batch()
    mask = packed.response_mask.float()
    reference_lp, reference_ent = _unchunked(model, packed, temperature)
    _objective(reference_lp, reference_ent, mask).backward()
    reference_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    logprobs, entropy = policy_logprobs_and_entropy(
        model, packed, responses, [[]] * 3, temperature, chunk_tokens=chunk_tokens
    )
    _objective(logprobs, entropy, mask).backward()
    assert torch.allclose(logprobs, reference_lp, atol=1e-5)
    assert torch.allclose(entropy, reference_ent, atol=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, reference_grads[name], atol=1e-5, rtol=1e-4), name
    only = policy_logprobs(model, packed, responses, [[]] * 3, temperature, chunk_tokens=chunk_tokens)
    assert torch.allclose(only, reference_lp, atol=1e-5)


def test_the_check_can_fail():
    """A wrong temperature or a misaligned position gives different numbers (the comparison has teeth)."""
    model = tiny_qwen2()
    packed, _ = _batch()
    hidden, weight = response_hidden_states(model, packed)
    reference, _ = _unchunked(model, packed, 1.0)
    tempered, _ = chunked_logprobs_and_entropy(hidden, weight, packed.response_ids, 0.7, chunk_tokens=4)
    shifted, _ = chunked_logprobs_and_entropy(
        hidden.roll(1, dims=1), weight, packed.response_ids, 1.0, chunk_tokens=4
    )
    mask = packed.response_mask.bool()
    assert (tempered - reference)[mask].abs().max() > 1e-2
    assert (shifted - reference)[mask].abs().max() > 1e-2


def test_backward_keeps_no_vocabulary_sized_tensor():
    """What autograd saves for backward: no ``(positions, V)`` logits, however many positions (the
    checkpointed chunks keep only their inputs)."""
    model = tiny_qwen2()
    packed, _ = _batch()
    hidden, weight = response_hidden_states(model, packed)
    vocab = weight.shape[0]
    saved: list[torch.Size] = []

    def pack(tensor):
        saved.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        chunked_logprobs_and_entropy(hidden, weight, packed.response_ids, 1.0, chunk_tokens=4)
    assert saved and not any(len(s) >= 2 and s[-1] == vocab and s.numel() > 4 * vocab for s in saved), saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        token_logprobs_and_entropy(hidden @ weight.T, packed.response_ids)
    assert any(s[-1] == vocab and s.numel() >= packed.response_ids.numel() * vocab for s in saved)


def test_no_grad_path_for_the_reference():
    model = tiny_qwen2()
    packed, responses = _batch()
    with torch.no_grad():
        logprobs = policy_logprobs(model, packed, responses, [[]] * 3, 1.0, chunk_tokens=5)
    assert not logprobs.requires_grad
    assert torch.allclose(logprobs, _unchunked(model, packed, 1.0)[0], atol=1e-5)


def test_fsdp2_chunked_gradients_on_two_gloo_ranks(tmp_path):
    """FSDP2 (``shard_model``): the chunked path uses the root's gathered output weight after its forward;
    values and gradients (gathered from the shards) equal a plain model's unchunked ones, exactly in float32
    and to bf16 rounding with bf16 compute (``MixedPrecisionPolicy``) over fp32 sharded masters."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    out = tmp_path / "result.json"
    command = [
        *launcher,
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",  # the worker as a module of the tests package (subprocess_env puts the repo root on PYTHONPATH)
        "tests.training.fsdp_chunked_worker",
        str(out),
    ]
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    results = json.loads(out.read_text())
    for compute, (logprob_tol, grad_tol) in {"float32": (1e-5, 1e-4), "bfloat16": (5e-2, 5e-2)}.items():
        result = results[compute]
        assert result["used_chunked_path"] and result["finite"], result
        assert result["max_logprob_diff"] < logprob_tol, result
        assert result["max_grad_rel_diff"] < grad_tol, result
        assert result["master_dtypes"] == ["torch.float32"]  # bf16 only in the all-gathered compute copies
