"""Evaluation runner: scores, files, reproducibility, resume (also after a kill), CLI."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.base import Task
from agents.cli import main
from agents.evaluate import EvalConfig, evaluate, load_finished
from agents.report import task_family
from agents.scripted import HumanAgent
from tests.paths import REPO_ROOT as REPO


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def _random_episodes(env_id: str, out: Path, **settings) -> list[dict]:
    """The random agent's evaluation on ``env_id`` (``settings``: the rest of its config): its records, by
    task."""
    evaluate(EvalConfig(env_id=env_id, agent="random", out_dir=str(out), **settings), progress=False)
    return sorted(_lines(out), key=lambda r: r["task_index"])


def test_expert_solves_every_toy_alfworld_task_and_the_report_holds_the_numbers(tmp_path):
    summary = evaluate(
        EvalConfig(env_id="agents-test/ToyALFWorld-v0", agent="expert", out_dir=str(tmp_path), num_envs=4),
        progress=False,
    )
    assert summary["episodes"] == 12 and summary["success_rate"] == 1.0
    assert summary["per_task_type"] == {f: 1.0 for f in ("pick_two", "clean", "heat", "cool", "look", "pick")}
    assert summary["per_task_type_episodes"]["pick"] == 2
    assert summary["invalid_action_rate"] == 0.0 and summary["inadmissible_action_rate"] == 0.0
    records = _lines(tmp_path)
    assert sorted(r["task_index"] for r in records) == list(range(12))
    assert summary["mean_steps"] == pytest.approx(sum(r["steps"] for r in records) / 12)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    report = (tmp_path / "report.md").read_text()
    assert "| success rate | 1.0000 |" in report and "| heat | 2 | 1.0000 |" in report
    assert f"| mean steps | {summary['mean_steps']:.2f} |" in report
    assert (tmp_path / "success.png").read_bytes()[:4] == b"\x89PNG"
    step = records[0]["trajectory"][0]
    assert {
        "observation",
        "obs_hash",
        "history_key",
        "prompt",
        "raw_output",
        "action",
        "reward",
        "valid",
    } <= set(step)
    assert len(records[0]["final_history_key"]) == 16


def test_webshop_success_and_mean_score(tmp_path):
    summary = evaluate(
        EvalConfig(
            env_id="agents-test/ToyWebShop-v0", agent="random", out_dir=str(tmp_path), num_envs=3, seed=1
        ),
        progress=False,
    )
    records = _lines(tmp_path)
    assert summary["per_task_type"] == {}
    assert summary["success_rate"] == pytest.approx(sum(r["won"] for r in records) / 8)
    assert summary["mean_score"] == pytest.approx(sum(r["score"] for r in records) / 8)
    assert 0 < summary["mean_score"] < 1


def test_episodes_plays_the_first_n_tasks_and_seed_fixes_the_run_whatever_the_batching(tmp_path):
    env_id = "agents-test/ToyALFWorld-v0"
    one, four = (_random_episodes(env_id, tmp_path / f"{n}", episodes=5, num_envs=n, seed=11) for n in (1, 4))
    assert [r["task_index"] for r in one] == [0, 1, 2, 3, 4]
    assert one == four
    assert _random_episodes(env_id, tmp_path / "other-seed", episodes=5, seed=12) != one


def test_async_vector_mode_gives_the_same_episodes(tmp_path):
    settings = {"episodes": 4, "num_envs": 2, "seed": 5}
    sync, asynchronous = (
        _random_episodes("agents-test/ToyWebShop-v0", tmp_path / mode, vector_mode=mode, **settings)
        for mode in ("sync", "async")
    )
    assert sync == asynchronous


def test_resume_plays_only_missing_tasks_and_drops_a_cut_line(tmp_path):
    config = EvalConfig(
        env_id="agents-test/ToyALFWorld-v0", agent="expert", out_dir=str(tmp_path), episodes=3
    )
    evaluate(config, progress=False)
    first = (tmp_path / "trajectories.jsonl").read_text()
    with (tmp_path / "trajectories.jsonl").open("a") as f:
        f.write('{"task_index": 3, "trunc')  # a line cut short by a kill
    config.episodes, config.num_envs = 7, 2
    summary = evaluate(config, progress=False)
    text = (tmp_path / "trajectories.jsonl").read_text()
    assert text.startswith(first)
    assert sorted(r["task_index"] for r in _lines(tmp_path)) == list(range(7))
    assert summary["episodes"] == 7
    with pytest.raises(ValueError, match="other settings"):
        evaluate(
            EvalConfig(env_id="agents-test/ToyALFWorld-v0", agent="random", out_dir=str(tmp_path)),
            progress=False,
        )


def test_resume_after_the_process_is_killed(tmp_path):
    out = tmp_path / "run"
    code = (
        "import sys, tests.agents.agents_toy_envs; "  # run with cwd=REPO: `python -c` puts it on sys.path
        "from agents.cli import main; "
        "raise SystemExit(main(sys.argv[1:]))"
    )
    argv = [
        sys.executable,
        "-c",
        code,
        "--env",
        "agents-test/ToyALFWorld-v0",
        "--agent",
        "expert",
        "--out",
        str(out),
        "--episodes",
        "12",
        "--env-arg",
        "step_delay=0.05",
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trajectories = out / "trajectories.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        not trajectories.exists() or trajectories.read_text().count("\n") < 3
    ):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    done_before = load_finished(trajectories)
    assert 3 <= len(done_before) < 12, "the run should have been killed part-way"
    before = {t: json.dumps(r, sort_keys=True) for t, r in done_before.items()}
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    records = _lines(out)
    assert sorted(r["task_index"] for r in records) == list(range(12))  # nothing played twice
    assert all(
        json.dumps(r, sort_keys=True) == before[r["task_index"]] for r in records if r["task_index"] in before
    )
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 1.0


def test_task_families():
    assert [
        task_family(t)
        for t in (
            "pick_and_place_simple",
            "look_at_obj_in_light",
            "pick_clean_then_place_in_recep",
            "pick_heat_then_place_in_recep",
            "pick_cool_then_place_in_recep",
            "pick_two_obj_and_place",
            "6",
            "other",
        )
    ] == ["pick", "look", "clean", "heat", "cool", "pick_two", "pick_two", "other"]


def test_human_agent_reads_numbers_and_text():
    answers = io.StringIO("2\n\nopen drawer 1\n")
    output = io.StringIO()
    agent = HumanAgent(input_stream=answers, output_stream=output)
    agent.reset([Task("alfworld", 0, "t", "find a mug"), Task("alfworld", 1, "t1", "find a pen")])
    infos = [{"admissible_actions": ["look", "go to desk 1"]}, {"admissible_actions": ["look"]}]
    decisions = agent.act(["obs a", "obs b"], infos)
    assert [(d.action, d.admissible) for d in decisions] == [("go to desk 1", True), ("open drawer 1", False)]
    assert "find a mug" in output.getvalue() and "2. go to desk 1" in output.getvalue()
    with pytest.raises(EOFError):
        agent.act(["obs a", "obs b"], infos)


def test_cli_errors_are_reported_not_raised(tmp_path, capsys):
    base = ["--env", "agents-test/ToyALFWorld-v0", "--out", str(tmp_path / "x"), "--no-progress"]
    assert main(base + ["--agent", "openai"]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(base + ["--agent", "expert", "--episodes", "99"]) == 2
    assert "--episodes must be in 1..12" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--agent", "nobody"])


def test_expert_needs_expert_info(tmp_path):
    config = EvalConfig(
        env_id="agents-test/ToyALFWorld-v0", agent="expert", out_dir=str(tmp_path), episodes=1, env_kwargs={}
    )
    from agents.scripted import ExpertAgent

    agent = ExpertAgent()
    agent.reset([Task("alfworld", 0, "t", "x")])
    with pytest.raises(RuntimeError, match="expert=True"):
        agent.act(["obs"], [{"admissible_actions": ["look"]}])
    assert evaluate(config, progress=False)["success_rate"] == 1.0


def test_env_url_for_an_env_without_url_goes_remote_or_fails_clearly(tmp_path, capsys):
    argv = [
        "--env",
        "agents-test/ToyALFWorld-v0",
        "--agent",
        "random",
        "--env-url",
        "http://127.0.0.1:9/",
        "--out",
        str(tmp_path / "remote"),
        "--no-progress",
    ]
    assert main(argv) == 2  # nothing listens on port 9 (or Remote-v0 is not registered)
    err = capsys.readouterr().err
    assert "progpo/Remote-v0 is not registered" in err or "127.0.0.1:9" in err
    assert not (tmp_path / "remote" / "trajectories.jsonl").exists()


def test_unknown_env_argument_is_a_clear_error(tmp_path, capsys):
    argv = [
        "--env",
        "agents-test/ToyALFWorld-v0",
        "--agent",
        "random",
        "--env-arg",
        'colour="blue"',
        "--out",
        str(tmp_path / "x"),
        "--no-progress",
    ]
    assert main(argv) == 2
    assert "cannot be made with the arguments ['colour']" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
