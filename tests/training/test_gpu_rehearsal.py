"""A CPU rehearsal of both GPU presets: their settings, only the sizes cut (``-m rehearsal``; CI runs it).

The presets (``configs/*_qwen2.5-1.5b.yaml``) as a researcher runs them, except what a CPU cannot afford: the
model is Qwen2.5-1.5B-Instruct's real shape (hidden 1536, 12 query / 2 key-value heads, 8960 MLP, tied
embeddings, the full 151,936-row vocabulary and Qwen2.5's tokenizer and chat template) cut to 2 decoder layers
and random-initialised; groups, episodes, prompts and responses are short. Everything else is the preset's:
free-text sampling with the papers' ``default`` template, bf16 compute over fp32 master weights (CPU
autocast), pi_old recomputed by the training model, lr 1e-6, gradient checkpointing, the k3 KL to a bf16
reference, and FSDP2 over 2 gloo ranks with ``MixedPrecisionPolicy``. The WebShop run is killed after its
first checkpoint, resumed with ``--resume``, exported in bf16, reloaded with ``from_pretrained`` and evaluated
with ``progpo eval --agent transformers``; the ALFWorld run trains one iteration on the same path (on real
ALFWorld data where the tests have it, ``PROGPO_TEST_ALFWORLD_DATA``, else on generated games asked for by
name: the preset refuses to fall back to them silently). The per-GPU memory budget
(:func:`training.costs.config_budget`) is checked against what the 2-layer ranks hold.

``scripts/gpu_check.sh --dry-run`` (the GPU check's CPU twin) runs here too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.training.rehearsal_helpers import (
    assert_learning_numerics,
    assert_memory_budget,
    kill_after_first_checkpoint_and_resume,
    train_command,
    train_records,
)
from tests.training.training_helpers import REPO, subprocess_env

# Each rehearsal runs several bf16 processes of a vocabulary-sized model on CPU: ~10 min on 2 cores, so the
# suite-wide 600 s per-test timeout is too tight for them.
pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(1800)]


def test_webshop_preset_rehearsal_kill_resume_export_eval(tmp_path):
    env = subprocess_env()
    run_dir = tmp_path / "run"
    command = train_command("webshop_progpo_qwen2.5-1.5b.yaml", run_dir, "iterations=2")
    resumed = kill_after_first_checkpoint_and_resume(command, env, run_dir, tmp_path / "first.log", 900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = train_records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2]
    assert_learning_numerics(records)
    assert_memory_budget(run_dir, world_size=2)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run_dir / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    assert next(model.parameters()).dtype.is_floating_point
    saved = json.loads((final / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "bfloat16"  # model.export_dtype of the preset
    assert model.config.vocab_size == 151936 and model.config.num_hidden_layers == 2
    assert model.config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(final)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert prompt.startswith("<|im_start|>system\n") and "<|im_start|>user\nhi<|im_end|>" in prompt

    out = tmp_path / "eval"
    evaluated = subprocess.run(
        [
            sys.executable,
            "-m",
            "progpo.cli",
            "eval",
            "--env",
            "progpo/WebShop-v0",
            "--agent",
            "transformers",
            "--model",
            str(final),
            "--episodes",
            "1",
            "--max-steps",
            "2",
            "--max-tokens",
            "6",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 1


def test_alfworld_preset_rehearsal(tmp_path):
    if importlib.util.find_spec("alfworld") is None:  # not importorskip: `import alfworld` sets ALFWORLD_DATA
        pytest.skip("the ALFWorld engine is not installed")
    run_dir = tmp_path / "run"
    real = os.environ.get("PROGPO_TEST_ALFWORLD_DATA")  # the tests' real trials hold no train split
    data = [f"env.data_dir={real}", "env.train_split=valid_train"] if real else ["env.data_dir=generated"]
    command = train_command("alfworld_progpo_qwen2.5-1.5b.yaml", run_dir, "iterations=1", *data)
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    records = train_records(run_dir)
    assert [r["iteration"] for r in records] == [1]
    assert_learning_numerics(records)
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out), "--threads", "1"],
        env={**subprocess_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0, (result.get("error"), done.stderr[-3000:])
    assert result["status"] == "passed"
    assert result["params_changed_frac"] >= 0.5
    assert result["first_ratio_max_abs_dev"] <= 1e-3
    assert result["nonfinite"] is False
    assert 0 <= result["sampler_logprob_gap_max"] and result["sampler_logprob_gap_mean"] <= 0.05
    for key in ("rollout_tokens_per_s", "update_tokens_per_s", "peak_memory_bytes"):
        assert result[key] > 0, key
    assert result["mfu"]["tokens"] > 0 and result["mfu"]["measured_peak_flops"] > 0
    assert result["mfu"]["vs_measured"] > 0 and result["mfu"]["vs_datasheet"] is None  # no GPU here
    variants = result["variants"]
    assert variants["transformers"]["status"] == variants["fsdp2"]["status"] == "passed"
    assert variants["transformers"]["sync_s"] < variants["fsdp2"]["sync_s"]  # only a rollout copy is synced
    expected = "passed" if importlib.util.find_spec("vllm") else "skipped"
    assert variants["vllm"]["status"] == expected, variants["vllm"]
    # the asynchronous variant ran the same checks, and its rollout tokens/s stands beside the lock-step one
    assert result["variants"]["async"]["status"] == "passed"
    wall = result["rollout_wall_tokens_per_s"]
    assert wall["async"] > 0 < wall["transformers"]
    assert result["async_rollout_speedup"]["async"] > 0
