"""The GPU presets rehearsed on the CPU: their real model width cut to 2 layers, the sizes a CPU affords, and
what every rehearsal checks (``test_gpu_rehearsal.py``, ``test_vllm_rehearsal.py``)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.training.training_helpers import REPO, torchrun_train

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


def train_command(preset: str, run_dir: Path, *extra: str) -> list[str]:
    shape = [f"model.tiny.{key}={value}" for key, value in QWEN25_1_5B_TWO_LAYERS.items()]
    config = REPO / "configs" / preset
    return torchrun_train(config, f"run_dir={run_dir}", "model.path=", *shape, *CUT_SIZES, *extra)


def train_records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def assert_memory_budget(run_dir: Path, world_size: int) -> None:
    """The static parts of the per-GPU budget are what a rank holds (the budget the preset headers state)."""
    import yaml

    from training.config import config_from_dict
    from training.costs import ModelShape, config_budget

    config = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    shape = ModelShape.from_hf_config(json.loads((run_dir / "tiny_policy" / "config.json").read_text()))
    budget = config_budget(config, shape, world_size).parts
    [measured] = train_records(run_dir, "memory")
    for part in ("params", "grads", "optimizer", "reference", "sampler"):
        assert measured[f"{part}_bytes"] == pytest.approx(budget[part], rel=0.02), part


def assert_learning_numerics(records: list[dict]) -> None:
    """What the presets' recipe must give at lr 1e-6: updates that land, pi_old equal to the first pass."""
    for r in records:
        assert r["params_changed_frac"] >= 0.5, r  # fp32 masters: bf16 weights would round ~1e-6 away
        assert r["first_ratio_max_abs_dev"] <= 1e-3, r  # algo.recompute_old_logprobs
        assert all(abs(r[k]) < float("inf") for k in ("pg_loss", "kl", "entropy", "grad_norm")), r


def wait_for_checkpoint(process: subprocess.Popen, folder: Path, timeout_s: float) -> None:
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


def kill_job(launcher: subprocess.Popen) -> None:
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


def kill_after_first_checkpoint_and_resume(
    command: list[str], env: dict[str, str], run_dir: Path, log_path: Path, timeout_s: float
) -> subprocess.CompletedProcess:
    """Run ``command`` (its output to ``log_path``) until iteration 1's checkpoint is intact, SIGKILL the
    whole job mid-way through iteration 2, check that only iteration 1 was recorded, then run it again with
    ``--resume``; the resumed run (each run within ``timeout_s``)."""
    with log_path.open("w") as log:
        first = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for_checkpoint(first, run_dir / "checkpoints" / "iter_000001", timeout_s=timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log_path.read_text()[-4000:]}") from None
        finally:
            kill_job(first)  # the whole torchrun job, mid-way through iteration 2
    assert [r["iteration"] for r in train_records(run_dir)] == [1]
    return subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=timeout_s)
