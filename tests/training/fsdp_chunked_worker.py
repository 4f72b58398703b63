"""One rank of ``test_chunked_logprobs.py::test_fsdp2_chunked_gradients_on_two_gloo_ranks`` (``torchrun
--nproc_per_node 2 -m tests.training.fsdp_chunked_worker OUT.json``: float32, then bfloat16 compute), and the
tiny batch and objective that test module uses (on :func:`tests.training.training_helpers.tiny_qwen2`).

Every rank builds the same model and batch; FSDP2 averages the ranks' gradients, so the sharded model's
gradients equal one plain model's on that batch. Rank 0 writes the comparison to ``OUT.json``.
"""

from __future__ import annotations

import json
import sys

import torch

from tests.training.training_helpers import tiny_qwen2
from training.sampling import PackedBatch, pack_sequences


def tiny_batch(seed: int = 1) -> tuple[PackedBatch, list[list[int]]]:
    """Three rows of different prompt and response lengths (padding on both sides)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 300, (n,), generator=generator).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(1, 300, (n,), generator=generator).tolist() for n in (7, 2, 11)]
    return pack_sequences(prompts, responses, pad_token_id=0), responses


def objective(logprobs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A loss that weighs every position differently (so misplaced gradients show)."""
    return ((logprobs * torch.linspace(-1, 1, logprobs.shape[1]) + 0.1 * entropy) * mask).sum()


def compare(compute: str) -> dict:
    """Chunked log-probs of an FSDP2-sharded copy (``compute`` dtype) against a plain model's full logits."""
    import copy

    from training.distributed import shard_model
    from training.policy import compute_context
    from training.sampling import (
        policy_logprobs_and_entropy,
        response_hidden_states,
        response_logits,
        token_logprobs_and_entropy,
    )

    dtype = getattr(torch, compute)
    plain = tiny_qwen2()
    sharded = shard_model(copy.deepcopy(plain), compute_dtype=dtype)
    packed, responses = tiny_batch()
    mask = packed.response_mask.float()

    with compute_context("cpu", dtype):
        logits = response_logits(plain, packed)
    reference_lp, reference_ent = token_logprobs_and_entropy(logits, packed.response_ids)
    objective(reference_lp, reference_ent, mask).backward()

    used_chunked = response_hidden_states(sharded, packed) is not None
    sharded.zero_grad()
    logprobs, entropy = policy_logprobs_and_entropy(sharded, packed, responses, [[]] * 3, chunk_tokens=4)
    objective(logprobs, entropy, mask).backward()

    grad_rel = 0.0
    finite = bool(torch.isfinite(logprobs).all() and torch.isfinite(entropy).all())
    for p_plain, p_sharded in zip(plain.parameters(), sharded.parameters(), strict=True):
        full = p_sharded.grad.full_tensor()
        finite &= bool(torch.isfinite(full).all())
        grad_rel = max(grad_rel, float((full - p_plain.grad).norm() / p_plain.grad.norm().clamp_min(1e-12)))
    return {
        "used_chunked_path": used_chunked,
        "max_logprob_diff": float(((logprobs.detach() - reference_lp.detach()).abs() * mask).max()),
        "max_grad_rel_diff": grad_rel,
        "finite": finite,
        "master_dtypes": sorted({str(p.to_local().dtype) for p in sharded.parameters()}),
    }


def main(out_path: str) -> None:
    from training.distributed import DistContext

    torch.set_num_threads(1)
    ctx = DistContext.from_env()
    results = {compute: compare(compute) for compute in ("float32", "bfloat16")}
    if ctx.is_main:
        with open(out_path, "w") as out:
            json.dump(results, out)
    ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1])
