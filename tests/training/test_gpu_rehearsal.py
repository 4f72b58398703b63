"""A CPU rehearsal of both GPU presets: their settings, only the sizes cut (``-m rehearsal``; CI runs it).

The presets (``configs/*_qwen2.5-1.5b.yaml``) as a researcher runs them, except what a CPU cannot afford: the
model is Qwen2.5-1.5B-Instruct's real shape (hidden 1536, 12 query / 2 key-value heads, 8960 MLP, tied
embeddings, the full 151,936-row vocabulary and Qwen2.5's tokenizer and chat template) cut to 2 decoder layers
and random-initialised; groups, episodes, prompts and responses are short. Everything else is the preset's:
free-text sampling with the papers' ``default`` template, bf16 compute over fp32 master weights (CPU
autocast), pi_old recomputed by the training model, lr 1e-6, gradient checkpointing, the k3 KL to a bf16
reference, and FSDP2 over 2 gloo ranks with ``MixedPrecisionPolicy``. The WebShop run is killed after its
first checkpoint, resumed with ``--resume``, exported in bf16, reloaded with ``from_pretrained`` and evaluated
with ``progpo eval --agent transformers``; the ALFWorld run trains one iteration on the same path.

``scripts/gpu_check.sh --dry-run`` (the GPU check's CPU twin) runs here too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from training_helpers import REPO, subprocess_env, torchrun_train

# Each rehearsal runs several bf16 processes of a vocabulary-sized model on CPU: ~10 min on 2 cores, so the
# suite-wide 600 s per-test timeout is too tight for them.
pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(1800)]

#: Qwen2.5-1.5B-Instruct's config.json, as ``model.tiny`` fields, cut to 2 decoder layers.
QWEN25_1_5B_TWO_LAYERS = {
    "vocab_size": 151643,  # the BPE ids; the 22 specials follow, as in Qwen's tokenizer
    "embedding_rows": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 2,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
#: What the rehearsal cuts from the presets (sizes only).
CUT_SIZES = [
    "device=cpu",
    "num_threads=1",
    "rollout.num_groups=2",
    "rollout.group_size=2",
    "env.max_steps=2",
    "rollout.max_new_tokens=4",
    "rollout.max_prompt_tokens=32",
    "env.vector_mode=sync",
    "eval.num_tasks=0",
    "eval.before_rl=false",
    "checkpoint_every=1",
    "tensorboard=false",
    "progress=false",
    "model.compute_dtype=bfloat16",  # the presets' value (auto would be float32 on a CPU)
]


def _train_command(preset: str, run_dir: Path, *extra: str) -> list[str]:
    shape = [f"model.tiny.{key}={value}" for key, value in QWEN25_1_5B_TWO_LAYERS.items()]
    config = REPO / "configs" / preset
    return torchrun_train(config, f"run_dir={run_dir}", "model.path=", *shape, *CUT_SIZES, *extra)


def _train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def _assert_learning_numerics(records: list[dict]) -> None:
    """What the presets' recipe must give at lr 1e-6: updates that land, pi_old equal to the first pass."""
    for r in records:
        assert r["params_changed_frac"] >= 0.5, r  # fp32 masters: bf16 weights would round ~1e-6 away
        assert r["first_ratio_max_abs_dev"] <= 1e-3, r  # algo.recompute_old_logprobs
        assert all(abs(r[k]) < float("inf") for k in ("pg_loss", "kl", "entropy", "grad_norm")), r


def _wait_for_checkpoint(process: subprocess.Popen, folder: Path, timeout_s: float) -> None:
    from training.checkpoint import CheckpointError, verify_checkpoint

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before its first RL checkpoint"
        try:
            verify_checkpoint(folder)
            return
        except (CheckpointError, OSError):
            time.sleep(1.0)
    raise AssertionError(f"no intact {folder.name} after {timeout_s} s")


def _kill_job(launcher: subprocess.Popen) -> None:
    """SIGKILL torchrun and every rank it started (its ranks need not share its process group)."""
    try:
        job = psutil.Process(launcher.pid)
        processes = [job, *job.children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=60)
    launcher.wait()


def test_webshop_preset_rehearsal_kill_resume_export_eval(tmp_path):
    env = subprocess_env()
    run_dir = tmp_path / "run"
    command = _train_command("webshop_progpo_qwen2.5-1.5b.yaml", run_dir, "iterations=2")
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        first = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _wait_for_checkpoint(first, run_dir / "checkpoints" / "iter_000001", timeout_s=900)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log_path.read_text()[-4000:]}") from None
        finally:
            _kill_job(first)  # the whole torchrun job, mid-way through iteration 2
    assert [r["iteration"] for r in _train_records(run_dir)] == [1]

    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = _train_records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2]
    _assert_learning_numerics(records)

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
            "progpo_envs.cli",
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
    command = _train_command("alfworld_progpo_qwen2.5-1.5b.yaml", run_dir, "iterations=1")
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    records = _train_records(run_dir)
    assert [r["iteration"] for r in records] == [1]
    _assert_learning_numerics(records)
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
    for key in ("rollout_tokens_per_s", "update_tokens_per_s", "peak_memory_bytes"):
        assert result[key] > 0, key
    # the asynchronous variant ran the same checks, and its rollout tokens/s stands beside the lock-step one
    assert result["variants"]["async"]["status"] == "passed"
    wall = result["rollout_wall_tokens_per_s"]
    assert wall["async"] > 0 < wall["transformers"]
    assert result["async_rollout_speedup"]["async"] > 0
