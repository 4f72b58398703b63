"""``examples/trl_alfworld.py``, the TRL example of docs/hosting.md ("Training with TRL"), as a user runs it.

* (fast) the code docs/hosting.md shows is the example's: every line of its ``python`` block is a line of the
  file;
* (slow, ``.ci/run``) the example's shortened run (``benchmarks.bench_training.QUICK_ARGS``: a few SFT and
  GRPO steps, a couple of held-out episodes) as a subprocess, with the OpenEnv server it starts itself: TRL's
  ``SFTTrainer`` lowers its loss on the expert's conversations (one logged loss per step), ``GRPOTrainer``
  takes its steps on rollouts against the server, and the held-out success before and after is recorded in [0,
  1]. Six SFT steps do not teach the tiny policy a well-formed ``act`` call (measured: not even 60 steps, loss
  0.87, do), so the calls themselves are shown by the full run (``benchmarks/results/trl_alfworld.json``: 2-3
  calls an episode) and GRPOTrainer's tool wiring by ``tests/agents/test_agents_trl.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

from benchmarks.bench_training import EXAMPLE, QUICK_ARGS
from tests.paths import REPO_ROOT as ROOT


def docs_block() -> str:
    """The ``python`` block of docs/hosting.md's "Training with TRL"."""
    text = (ROOT / "docs" / "hosting.md").read_text()
    start = text.index("\n### Training with TRL\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_docs_show_the_examples_code():
    example = {line.strip() for line in (ROOT / EXAMPLE).read_text().splitlines()}
    shown = [line.strip() for line in docs_block().splitlines() if line.strip() and line.strip() != "..."]
    assert len(shown) > 20
    missing = [line for line in shown if line not in example]
    assert not missing, f"lines of docs/hosting.md's TRL example that {EXAMPLE} does not have: {missing}"


@pytest.mark.slow  # ~1.5 min on 2 cores; .ci/run runs it
def test_the_shortened_example_warm_starts_trains_and_measures(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, EXAMPLE, *QUICK_ARGS, "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    sft = result["sft"]
    # the expert won its games, and TRL's SFTTrainer learnt from them: the loss fell
    assert sft["demo_won"] == sft["demo_episodes"] == sft["sft_conversations"] == 12
    assert len(sft["sft_losses"]) >= 4 and sft["sft_loss_last"] < sft["sft_loss_first"] - 1.0
    assert (run_dir / "sft" / "model.safetensors").is_file()
    # GRPOTrainer took its steps on rollouts against the server, its env reward logged each step
    grpo = result["grpo"]
    assert grpo["grpo_steps"] == 2 and len(grpo["grpo_reward"]) == len(grpo["grpo_env_reward"]) == 2
    assert all(math.isfinite(loss) for loss in grpo["grpo_loss"])
    assert all(0.0 <= reward <= 1.0 for reward in grpo["grpo_env_reward"])
    for when in ("before", "after"):
        evaluation = result[when]
        assert 0.0 <= evaluation["success"] <= 1.0 and evaluation["episodes"] == 2
        assert evaluation["completion_tokens"] > 0
    assert "held-out success" in done.stdout and "after 2 GRPO steps" in done.stdout


def _example_module():
    spec = importlib.util.spec_from_file_location("trl_alfworld_example", ROOT / EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pretrained_model_gets_fine_tuning_settings_and_bounded_sft_memory(tmp_path, capsys):
    """``--model``: fine-tuning rates (not the from-scratch 3e-3/3e-4), gradient checkpointing, one
    conversation per SFT forward pass (the step's others accumulated); each can still be set."""
    example = _example_module()
    (tmp_path / "config.json").write_text("{}")
    tuned = example.parse_args(["--model", str(tmp_path)])
    scratch = example.parse_args([])
    assert (tuned.sft_lr, tuned.grpo_lr, tuned.gradient_checkpointing) == (1e-5, 1e-6, True)
    assert (scratch.sft_lr, scratch.grpo_lr, scratch.gradient_checkpointing) == (3e-3, 3e-4, False)
    assert (tuned.sft_micro_batch_size, scratch.sft_micro_batch_size) == (1, scratch.sft_batch_size)
    mine = example.parse_args(["--model", str(tmp_path), "--sft-lr", "2e-5", "--no-gradient-checkpointing"])
    assert (mine.sft_lr, mine.gradient_checkpointing) == (2e-5, False)
    for argv, message in [
        (["--model", str(tmp_path / "missing")], "no config.json there"),
        (["--model", str(tmp_path), "--warm-start", str(tmp_path)], "give one"),
        (["--sft-batch-size", "4", "--sft-micro-batch-size", "3"], "must divide"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            example.parse_args(argv)
        assert stopped.value.code == 2 and message in capsys.readouterr().err, argv
