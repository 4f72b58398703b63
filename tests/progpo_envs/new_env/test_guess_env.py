"""The open env contract's proof: an env the project has never heard of (``guess_env``, defined here only) is
checked, evaluated, served and trained on through the project's own commands, with no edit anywhere else.

See docs/adding_an_environment.md; the env's module is the recipe the page describes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import gymnasium as gym
import pytest
import requests

from progpo.cli import main as progpo
from progpo_envs.core.checker import check_text_env
from tests.paths import repo_on_pythonpath
from tests.progpo_envs.new_env.guess_env import GUESS_ENV_ID, GuessEnv
from tests.training.training_helpers import TINY_RUN

#: The env's module, by its name in the tests package (subprocesses get the repo root on their PYTHONPATH).
GUESS_MODULE = GuessEnv.__module__
#: The env by Gymnasium's ``module:id``: any process imports its module first, as gym.make does.
PLAYED_ID = f"{GUESS_MODULE}:{GUESS_ENV_ID}"
#: The trainer's tiny settings (the env's own settings are not among them: none are needed).
TINY_TRAIN = ["iterations=1", "checkpoint_every=0", *TINY_RUN]


def _subprocess_env() -> dict[str, str]:
    env = repo_on_pythonpath()
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def served():
    """``progpo serve --import tests.progpo_envs.new_env.guess_env --env progpo/Guess-v0`` on a free loopback
    port (expert fixed on)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "progpo.cli", "serve", "--port", str(port), "--import", GUESS_MODULE]
    command += ["--env", GUESS_ENV_ID, "--env-kwargs", f'{GUESS_ENV_ID}={{"expert": true}}']
    server = subprocess.Popen(
        command, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                if requests.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "progpo serve did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(15)


@pytest.mark.parametrize("kwargs", [{}, {"expert": True, "history_depths": (1, 2)}])
def test_the_new_env_keeps_the_text_env_contract(kwargs):
    env = gym.make(GUESS_ENV_ID, **kwargs)
    check_text_env(env.unwrapped)
    env.close()


def test_progpo_eval_plays_it_with_the_expert_in_its_own_prompt_style(tmp_path, capsys):
    out = tmp_path / "eval"
    assert progpo(["eval", "--env", PLAYED_ID, "--agent", "expert", "--split", "test", "--out", str(out),
                   "--no-progress"]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == GuessEnv().num_tasks and summary["success_rate"] == 1.0
    assert set(summary["per_task_type"]) == {"low", "high"}
    assert json.loads((out / "run.json").read_text())["env_kind"] == "guess"  # from the env's metadata
    # the split is checked against the env's own split names, before anything is built
    assert progpo(["eval", "--env", PLAYED_ID, "--agent", "expert", "--split", "valid_seen", "--out",
                   str(tmp_path / "refused")]) == 2  # fmt: skip
    assert "choose from train, test" in capsys.readouterr().err


def test_progpo_serve_hosts_it_and_remote_v0_plays_it(served, tmp_path):
    remote = gym.make("progpo/Remote-v0", url=served, env_id=GUESS_ENV_ID, expert=True)
    assert remote.unwrapped.metadata["prompt_style"] == "guess"  # the hosted env's, for the client's prompts
    check_text_env(remote.unwrapped)  # the same contract over HTTP
    remote.close()
    out = tmp_path / "remote-eval"
    assert progpo(["eval", "--env", PLAYED_ID, "--env-url", served, "--agent", "expert", "--out", str(out),
                   "--no-progress"]) == 0  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 1.0
    assert json.loads((out / "run.json").read_text())["env_kind"] == "guess"


def test_progpo_train_runs_an_iteration_on_it_with_only_its_id_and_held_out_split(tmp_path):
    from agents.envs import prompt_style
    from training.config import load_config
    from training.envs import make_split_envs

    overrides = [f"env.id={PLAYED_ID}", "env.eval_split=test", *TINY_TRAIN]
    config = load_config(None, overrides)  # what `progpo train` loads: the quickstart preset, then these
    assert config.env.kwargs == {} and config.env.train_kwargs == {}  # ALFWorld's stay with ALFWorld
    envs = make_split_envs(config.env, config.env.train_split, 1, 1)
    assert prompt_style(envs) == "guess"
    envs.close()
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "progpo.cli", "train", *overrides, f"run_dir={run_dir}"],
        env=_subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [1]
    assert (run_dir / "final" / "config.json").is_file()
