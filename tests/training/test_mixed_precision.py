"""Mixed precision (issue 15): fp32 master weights with bf16 compute learn at lr 1e-6 where pure bf16
weights do not; the update-size diagnostic that tells them apart; export and sampling in bf16."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tests.training.fsdp_chunked_worker import tiny_batch
from tests.training.training_helpers import sample_from, tiny_qwen2
from training.policy import Policy, compute_context, export_policy, load_policy
from training.sampling import pack_sequences, policy_logprobs_and_entropy
from training.update_size import UpdateSize, snapshot_parameters, update_size


def _train_20_steps(model: torch.nn.Module) -> tuple[UpdateSize, list[float]]:
    """20 AdamW steps at lr 1e-6 of a policy-gradient-like objective under bf16 autocast."""
    packed, responses = tiny_batch()
    mask = packed.response_mask.float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    before = snapshot_parameters(model.parameters())
    losses = []
    for _ in range(20):
        optimizer.zero_grad(set_to_none=True)
        with compute_context("cpu", "bfloat16"):
            logprobs, entropy = policy_logprobs_and_entropy(model, packed, responses, [[]] * 3)
            loss = -((logprobs + 0.001 * entropy) * mask).sum() / mask.sum()
        assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return update_size(before, model.parameters()), losses


def test_fp32_masters_learn_at_lr_1e6_and_pure_bf16_weights_do_not():
    masters, master_losses = _train_20_steps(tiny_qwen2())
    pure, pure_losses = _train_20_steps(tiny_qwen2().to(torch.bfloat16))
    assert torch.isfinite(torch.tensor(master_losses + pure_losses)).all()
    assert masters.params_changed_frac >= 0.5, masters
    # the regression: bf16 weights lose most ~1e-6 steps to rounding (issue 15 measured 1.9%)
    assert pure.params_changed_frac < 0.25 * masters.params_changed_frac, (pure, masters)
    assert 1e-7 < masters.update_to_weight_ratio < 1e-3


def test_update_size_by_hand():
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    b = torch.nn.Parameter(torch.tensor([[0.0, 0.0], [0.0, 0.0]]))
    before = snapshot_parameters([a, b])
    with torch.no_grad():
        a[0] += 2.0
        b[1, 1] = 1.0
    size = update_size(before, [a, b])
    assert (size.changed, size.elements, size.delta_sq, size.weight_sq) == (2.0, 8.0, 5.0, 30.0)
    assert size.metrics() == {"params_changed_frac": 0.25, "update_to_weight_ratio": (5.0 / 30.0) ** 0.5}
    assert update_size(snapshot_parameters([a, b]), [a, b]).params_changed_frac == 0.0
    doubled = size.all_reduce(lambda value: 2 * value)  # as if two ranks had the same shards
    assert doubled.params_changed_frac == size.params_changed_frac and doubled.elements == 16.0
    with pytest.raises(ValueError, match="snapshot of 2"):
        update_size(before, [a])


def test_compute_context_is_autocast_only_below_float32():
    x = torch.ones(2, 2)
    with compute_context("cpu", "auto"):  # CPU: float32, nothing changes
        assert (x @ x).dtype == torch.float32
    with compute_context("cpu", torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16


def test_export_writes_the_requested_dtype_and_keeps_the_masters(tmp_path, tiny_policy_dir):
    policy = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    export_policy(policy, tmp_path / "bf16", dtype=torch.bfloat16)
    export_policy(policy, tmp_path / "same")
    assert next(policy.model.parameters()).dtype == torch.float32
    for folder, dtype in (("bf16", torch.bfloat16), ("same", torch.float32)):
        with safe_open(str(tmp_path / folder / "model.safetensors"), "pt") as saved:
            assert {saved.get_tensor(k).dtype for k in saved.keys()} == {dtype}
    reloaded = load_policy(tmp_path / "bf16", device="cpu", dtype="bfloat16").model
    name, param = next(iter(reloaded.named_parameters()))
    assert torch.equal(param, dict(policy.model.named_parameters())[name].to(torch.bfloat16))


def test_sampler_under_bf16_autocast_matches_the_trainer_forward(tiny_policy_dir):
    policy: Policy = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    tok = policy.tokenizer
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("go to desk 1", "look around " * 4)]
    with compute_context("cpu", "bfloat16"):
        out = sample_from(policy, prompts, max_new_tokens=6, seeds=[0, 1])
        packed = pack_sequences(prompts, out.token_ids, tok.pad_token_id)
        with torch.no_grad():
            logprobs, _ = policy_logprobs_and_entropy(policy.model, packed, out.token_ids, [[]] * 2)
    mask = packed.response_mask.bool()
    old = torch.zeros_like(logprobs)
    for row, values in enumerate(out.logprobs):
        old[row, : len(values)] = torch.tensor(values)
    assert torch.isfinite(old[mask]).all() and torch.isfinite(logprobs[mask]).all()
    # bf16 rounding, KV cache vs one forward: close, not equal (what algo.recompute_old_logprobs is for)
    assert (logprobs - old)[mask].abs().max() < 0.1
