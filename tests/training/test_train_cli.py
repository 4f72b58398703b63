"""``progpo train`` end to end on the toy env: smoke runs, config errors, and resume after a kill."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.paths import REPO_ROOT
from tests.training.training_helpers import (
    ONE_BARE_ITERATION,
    TINY_OVERRIDES,
    WEBSHOP_OVERRIDES,
    subprocess_env,
    tiny_trainer,
)
from training.cli import main

CONFIGS = REPO_ROOT / "configs"
VOLATILE = ("time", "per_s", "peak")  # wall-clock measurements differ between runs; everything else must not


def _collect(trainer, iteration: int):
    """The rollout of ``iteration`` as the trainer's loop makes it."""
    from training.rollout import collect_groups

    worker = trainer.rollout_worker
    return collect_groups(worker, trainer.engine, trainer.config, iteration, trainer.dist)


def _train_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.cli",
        "--config",
        str(CONFIGS / "quickstart.yaml"),
        *TINY_OVERRIDES,
        f"run_dir={run_dir}",
        *extra,
    ]


def _train(run_dir: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``progpo train`` (:func:`_train_cmd`) run to its end, its output captured."""
    return subprocess.run(
        _train_cmd(run_dir, *extra), env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )


def _start_train(run_dir: Path, *extra: str, **popen) -> subprocess.Popen:
    """``progpo train`` (:func:`_train_cmd`) started in the background (``popen``: where its output goes)."""
    return subprocess.Popen(_train_cmd(run_dir, *extra), env=subprocess_env(), **popen)


def _stable_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(word in k for word in VOLATILE)} for r in records]


RUN_ARGS = ("iterations=3", "checkpoint_every=1", "tensorboard=true")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """An uninterrupted 3-iteration run (checkpoint every iteration)."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    done = _train(run_dir, *RUN_ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir.parent / "stdout.txt").write_text(done.stdout)  # beside the run: the run dir stays a run's own
    return run_dir


def test_cli_says_what_it_does_first_and_ends_with_a_short_result_block(straight_run):
    lines = (straight_run.parent / "stdout.txt").read_text().splitlines()
    assert lines[0].startswith("[progpo train] starting ProGPO on ") and "2 groups x 2" in lines[0]
    assert any("CPU kernels" in line for line in lines[:3])
    done = next(i for i, line in enumerate(lines) if line.startswith("[progpo train] done: 3 iterations"))
    block = lines[done:]
    assert len(block) <= 10
    text = "\n".join(block)
    assert "held-out success: " in text and " -> " in text
    for name in ("summary.json", "metrics.jsonl", "learning_curve.png", "final"):
        assert str(straight_run / name) in text, name
    assert not any(line.startswith("{") for line in lines)  # no JSON dump of the summary


def test_a_log_file_gets_a_line_per_rl_iteration_and_the_weights_digests(straight_run):
    """Issue 39, items 4 and 7: in a log file (stdout not a terminal) the RL phase printed nothing per
    iteration (rich draws only its last state there); and the run printed no digest of its weights, though
    the docs said to compare them. Now one plain line per iteration, and the result block names the warm
    start's and the final weights with their SHA-256, which summary.json records as weights_sha256."""
    import hashlib

    lines = (straight_run.parent / "stdout.txt").read_text().splitlines()
    iterations = [line for line in lines if line.startswith("[progpo train] RL iteration ")]
    assert [line.split()[4].rstrip(":") for line in iterations] == ["1/3", "2/3", "3/3"], lines
    assert all(": success " in line and line.endswith(" s") for line in iterations)
    summary = json.loads((straight_run / "summary.json").read_text())
    digests = summary["weights_sha256"]
    assert set(digests) == {"reference", "final"}
    block = lines[next(i for i, line in enumerate(lines) if line.startswith("[progpo train] done: ")) :]
    for name in ("reference", "final"):
        weights = straight_run / name / "model.safetensors"
        assert digests[name] == hashlib.sha256(weights.read_bytes()).hexdigest(), name
        assert any(line.split()[:3] == ["sha256", digests[name], str(weights)] for line in block), block


def test_a_run_dir_that_holds_a_run_is_never_reused_silently(straight_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_run, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    again = _train(run_dir, *RUN_ARGS)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "--overwrite" in again.stderr and "--resume" in again.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing deleted


def test_a_second_train_on_a_live_run_dir_exits_2_in_one_line_and_the_first_is_untouched(tmp_path):
    """Issue 35, item 3 (before: two ``progpo train --resume`` on one run dir both ran, writing duplicate
    metric rows and overwriting each other's checkpoints)."""
    run_dir = tmp_path / "run"
    slow = ("iterations=6", "checkpoint_every=1", "warm_start.enabled=false", "eval.num_tasks=0")
    # a run still going while three more start and are refused (each a fresh interpreter importing torch: on a
    # loaded 2-core machine 0.5 s a step and 3 iterations let the first finish before the second was refused);
    # 0.75 s a step makes the 6 iterations last about a minute
    slow += ("env.kwargs={step_delay: 0.75}",)
    first = _start_train(run_dir, *slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints").is_dir() or not any((run_dir / "checkpoints").iterdir()):
            assert first.poll() is None and time.monotonic() < deadline, "no checkpoint from the first run"
            time.sleep(0.2)
        config_file = (run_dir / "config.yaml").stat()
        for extra in (["--resume"], ["--overwrite"], ["--resume-or-start"]):
            second = _train(run_dir, *slow, *extra, timeout=240)
            assert second.returncode == 2, second.stderr[-2000:]
            assert first.poll() is None, "the first run ended before the second was refused"
            assert second.stderr.count("\n") == 1 and second.stdout == ""
            assert f"is being written by progpo train (pid {first.pid})" in second.stderr, second.stderr
        assert (run_dir / "config.yaml").stat().st_mtime_ns == config_file.st_mtime_ns  # nothing written
    finally:
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in train if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]  # one row each
    resumed = _train(run_dir, *slow, "--resume")  # the lock went with the first process
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_resume_without_a_checkpoint_says_so_unless_asked_to_start(tmp_path):
    run_dir = tmp_path / "run"
    refused = _train(run_dir, "iterations=0", "--resume")
    assert refused.returncode == 2 and "no checkpoint to resume from" in refused.stderr
    assert not run_dir.exists()
    started = _train(run_dir, "iterations=0", "warm_start.enabled=false", "--resume-or-start")
    assert started.returncode == 0, started.stderr[-2000:]
    assert (run_dir / "summary.json").is_file()


def test_cli_run_writes_every_artefact(straight_run):
    run_dir = straight_run
    records = _stable_records(run_dir)
    kinds = [r["kind"] for r in records]
    assert kinds == ["warm_start", "eval", "train", "memory", "train", "train", "eval"]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2, 3]
    for key in (
        "success",
        "advantage_mean",
        "ratio",
        "kl",
        "entropy",
        "exact_prefix_peer_fraction",
        "grad_norm",
        "first_ratio_mean",
        "rows",
        "success/pick_and_place_simple",
    ):
        assert key in train[0], key
    assert train[0]["first_ratio_mean"] == pytest.approx(
        1.0, abs=1e-4
    )  # sampler/trainer parity inside the loop
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"before_rl", "after_rl"} <= set(summary)
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert list((run_dir / "tensorboard").iterdir())
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter_000003"
    # the export is a plain transformers folder
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(run_dir / "final").config.model_type == "qwen2"


@pytest.mark.parametrize("algo", ["gigpo"])
def test_algo_flag_selects_the_estimator(tmp_path, algo, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    code = main(
        [
            "--config",
            str(CONFIGS / "quickstart.yaml"),
            *TINY_OVERRIDES,
            f"run_dir={tmp_path}",
            *ONE_BARE_ITERATION,
            "--algo",
            algo,
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algo"] == algo
    # the run names what it ran on: CPU, torch's build, package versions, commit (training.provenance)
    environment = summary["environment"]
    assert {"cpu_model", "cpu_flags", "cpu_count", "python", "platform", "git"} <= set(environment)
    assert environment["torch_build"]["version"] == torch.__version__
    assert environment["packages"]["transformers"] == importlib.metadata.version("transformers")


def test_config_errors_exit_2(capsys):
    assert main(["rollout.group_sise=3"]) == 2
    assert "unknown key 'rollout.group_sise'" in capsys.readouterr().err


def test_resume_after_kill_matches_uninterrupted_run(tmp_path, straight_run):
    extra = RUN_ARGS

    killed = tmp_path / "killed"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = _start_train(killed, *extra, start_new_session=True, **quiet)  # its group is killed below
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if latest.is_file() and latest.read_text() == "iter_000001":
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "summary.json").exists()

    resumed = _train(killed, *extra, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from iteration" in resumed.stdout
    assert _stable_records(killed) == _stable_records(straight_run)


def test_lora_run_trains_adapters_only_and_exports_a_plain_model(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    lora = ("model.lora_rank=4", "model.lora_target_modules=[q_proj]")
    with tiny_trainer(tmp_path, *ONE_BARE_ITERATION, *lora) as trainer:
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.run()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert not any("lora" in n for n, _ in exported.named_parameters())


@pytest.mark.parametrize("preset", ["alfworld_progpo_qwen2.5-1.5b.yaml", "webshop_progpo_qwen2.5-1.5b.yaml"])
def test_gpu_presets_run_two_iterations_on_cpu(tmp_path, preset, tiny_policy_dir, monkeypatch):
    """The GPU presets' own settings (gradient checkpointing, async envs, no warm start, periodic validation)
    with
    the model, sizes and env shrunk to CPU scale."""
    from training.config import load_config
    from training.trainer import Trainer

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    shrink = [o for o in TINY_OVERRIDES if not o.startswith(("warm_start", "model.tiny"))]
    config = load_config(
        CONFIGS / preset,
        [
            *shrink,
            f"run_dir={tmp_path}",
            f"model.path={tiny_policy_dir}",
            "device=cpu",
            "model.dtype=float32",
            "iterations=2",
            "eval.every=1",
            "env.num_workers=2",
            "rollout.max_new_tokens=8",
        ],
    )
    assert config.model.gradient_checkpointing and config.env.vector_mode == "async"
    with contextlib.closing(Trainer(config)) as trainer:
        summary = trainer.run()
    assert summary["iterations"] == 2
    records = trainer.metrics.read()
    assert [r["label"] for r in records if r["kind"] == "eval"] == ["before_rl", "periodic", "after_rl"]


def test_free_text_iteration_on_the_real_webshop_env(tmp_path, monkeypatch):
    """The WebShop env in-process (its info nests ``available_actions``), free text as in the papers: every
    step becomes a row with its hashes, invalid text is penalised, not a crash."""
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    with tiny_trainer(tmp_path, *WEBSHOP_OVERRIDES, "env.max_steps=3", "warm_start.enabled=false") as trainer:
        result = _collect(trainer, 0)
        metrics = trainer.train_iteration(1)
    rows = result.rows
    assert rows.num_rows >= 4 and all(key != 0 for key in rows.obs_key)
    first_prompt = trainer.tokenizer.decode(rows.prompt_ids[0])
    assert "Task: " in first_prompt and "search[<your query>]" in first_prompt  # the page's admissible search
    assert 0.0 <= metrics["invalid_rate"] <= 1.0 and np.isfinite(metrics["pg_loss"])


def test_dynamic_sampling_runs_more_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    dapo = ("rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=2", "algo.name=dapo")
    with tiny_trainer(tmp_path, *ONE_BARE_ITERATION, *dapo) as trainer:
        result = _collect(trainer, 0)
    # an untrained policy never wins: no group has mixed outcomes, both rounds run, the last one is kept
    max_steps = trainer.config.env.max_steps
    assert result.env_steps == 2 * 4 * max_steps
    assert result.rows.num_rows == 4 * max_steps


def test_update_moves_probability_towards_positive_advantages(tmp_path, monkeypatch):
    """One update on real rollout rows: responses with A > 0 gain log-probability, A < 0 lose it."""
    from training.sampling import pack_sequences, response_logits, token_logprobs_and_entropy

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    with tiny_trainer(tmp_path, *ONE_BARE_ITERATION, "loss.kl_coef=0", "optim.lr=1e-3") as trainer:
        rows = _collect(trainer, 0).rows
    config = trainer.config
    advantages = np.where(np.arange(rows.num_rows) % 2 == 0, 1.0, -1.0)

    def sequence_logprobs() -> np.ndarray:
        packed = pack_sequences(rows.prompt_ids, rows.response_ids, trainer.tokenizer.pad_token_id)
        with torch.no_grad():
            logits = response_logits(trainer.model, packed, config.rollout.temperature)
            logprobs, _ = token_logprobs_and_entropy(logits, packed.response_ids)
        return (logprobs * packed.response_mask).sum(-1).numpy()

    before = sequence_logprobs()
    stats = trainer.update(rows, advantages, 0, np.ones(rows.num_rows, dtype=bool))
    after = sequence_logprobs()
    assert stats["first_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    change = after - before
    assert change[advantages > 0].mean() > 0 > change[advantages < 0].mean()


def test_task_pool_limits_rl_tasks_and_is_evaluated_before_and_after(tmp_path, monkeypatch):
    """``rollout.task_pool``: RL draws from N tasks spread over the split; ``eval.rl_tasks`` measures them."""
    from agents.envs import num_tasks, spread_tasks

    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    pooled = ("rollout.num_groups=3", "rollout.task_pool=2", "eval.rl_tasks=true", "eval.seeds=2")
    with tiny_trainer(
        tmp_path, "iterations=2", "warm_start.enabled=false", *pooled, "checkpoint_every=0"
    ) as trainer:
        pool = {f"train-{t}" for t in spread_tasks(num_tasks(trainer.rollout_worker.envs), 2)}
        drawn = {e.task_id for it in range(4) for e in _collect(trainer, it).episodes}
        summary = trainer.run()
    assert len(pool) == 2 and pool != {"train-0", "train-1"}  # spread over the split, not its first tasks
    assert drawn <= pool and drawn  # 12 group draws, only from the pool
    for label in ("rl_tasks_before_rl", "rl_tasks_after_rl"):
        assert summary[label]["episodes"] == 2 * 2  # every pooled task, once per seed
        assert len(summary[label]["success_per_seed"]) == 2
    assert summary["before_rl"]["episodes"] == summary["after_rl"]["episodes"] == 2 * 2  # held-out unchanged
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("eval_rl_tasks") == 2 and kinds.count("eval") == 2


def test_rl_tasks_evaluation_needs_a_task_pool():
    from training.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="task_pool"):
        load_config(None, ["rollout.task_pool=0", "eval.rl_tasks=true"])
