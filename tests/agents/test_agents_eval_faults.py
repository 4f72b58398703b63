"""``progpo eval`` under faults: failed requests, a damaged or shared output, a huge completion, Ctrl-C, an
uncached hub id. Every case loses no finished episode and says what went wrong in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agents.cli import main
from agents.evaluate import DAMAGED_FILE, MAX_STORED_OUTPUT_CHARS, EvalConfig, evaluate
from progpo_base.folder_lock import LOCK_FILE
from tests.paths import REPO_ROOT as REPO

TOY = "agents-test/ToyALFWorld-v0"
#: ``progpo eval`` in a subprocess, with the toy envs registered (run with cwd=REPO: ``python -c`` puts it on
#: sys.path). Ctrl-C at a terminal reaches a foreground process with Python's own SIGINT handler; a test
#: runner started in the background of a non-interactive shell (as `.ci/run` is) inherits SIGINT ignored, and
#: so would the run: it restores Python's handler first, as a terminal's foreground process has it.
EVAL_CLI = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import sys, tests.agents.agents_toy_envs; "
    "from agents.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def _argv(endpoint_url: str, out: Path, *extra: str) -> list[str]:
    return [
        "--env",
        TOY,
        "--agent",
        "openai",
        "--model",
        "scripted",
        "--base-url",
        endpoint_url,
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def test_a_refused_request_fails_its_episode_not_the_run(endpoint, tmp_path, capsys):
    """One 400 in the first batch: that episode is recorded with the error, the batch's other episodes are
    played to the end and scored; as 1 error is more than --max-errors allows on 6 episodes (5%), no further
    batch starts and the exit status is 1; a rerun plays the errored episode and the rest (before: the run
    stopped at the 400, dropped the batch's other episodes and wrote nothing about it)."""
    endpoint.faults = [("ok", 0)] * 5 + [("status", 400)]
    argv = _argv(endpoint.base_url, tmp_path, "--episodes", "6", "--num-envs", "3", "--concurrency", "3")
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 of 6 episodes ended with an agent error" in err[0]
    assert endpoint.base_url in err[0]
    records = _lines(tmp_path)
    errored = [r for r in records if "error" in r]
    assert len(records) == 3 and len(errored) == 1  # the first batch, its two other episodes finished
    assert "HTTP 400" in errored[0]["error"] and endpoint.base_url in errored[0]["error"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["errors"] == 1 and summary["failed"]
    assert summary["success_rate"] == 1.0  # the errored episode is not scored as a failure
    assert "ended with an agent error" in (tmp_path / "report.md").read_text()
    assert main(argv) == 0
    records = _lines(tmp_path)
    assert sorted(r["task_index"] for r in records) == list(range(6))
    assert not any("error" in r for r in records)
    assert json.loads((tmp_path / "summary.json").read_text())["errors"] == 0


def test_max_errors_tolerates_a_few_errors(endpoint, tmp_path):
    endpoint.faults = [("status", 401)]
    argv = _argv(endpoint.base_url, tmp_path, "--episodes", "4", "--num-envs", "2", "--max-errors", "1")
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 1 and summary["episodes"] == 3 and not summary["failed"]


def test_too_many_errors_stop_the_run_early(endpoint, tmp_path):
    """A bad key fails every request: the run stops once it has failed, not after every episode."""
    endpoint.faults = [("status", 401)] * 100
    argv = _argv(endpoint.base_url, tmp_path, "--episodes", "12", "--num-envs", "2", "--concurrency", "2")
    assert main(argv) == 1
    assert len(_lines(tmp_path)) == 2  # one batch; no further batch once the run had failed
    assert len(endpoint.requests) == 2


def test_one_damaged_line_replays_only_its_episode(endpoint, tmp_path):
    """A NUL byte in line 3 of 6: the rerun sets that line aside and plays its one task again (before: it cut
    the file at line 3 and replayed every later episode)."""
    argv = _argv(endpoint.base_url, tmp_path, "--episodes", "6", "--num-envs", "2")
    assert main(argv) == 0
    path = tmp_path / "trajectories.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    damaged_task = json.loads(lines[2])["task_index"]
    lines[2] = lines[2][:40] + b"\x00" + lines[2][41:]
    path.write_bytes(b"".join(lines))
    before = len(endpoint.requests)
    assert main(argv) == 0
    records = _lines(tmp_path)
    assert sorted(r["task_index"] for r in records) == list(range(6))
    assert [r["task_index"] for r in records][-1] == damaged_task  # the others kept, in place
    replayed = len(endpoint.requests) - before
    assert replayed == records[-1]["steps"]  # one episode's requests
    assert (tmp_path / DAMAGED_FILE).read_bytes() == lines[2]


def test_two_runs_on_one_out_do_not_both_write(tmp_path):
    """The second run is refused while the first holds the folder (before: both appended, 16 duplicates)."""
    config = EvalConfig(
        env_id=TOY, agent="expert", out_dir=str(tmp_path), episodes=6, env_kwargs={"step_delay": 0.2}
    )
    first = threading.Thread(target=evaluate, args=(config,), kwargs={"progress": False})
    first.start()
    while not (tmp_path / LOCK_FILE).exists():
        time.sleep(0.02)
    time.sleep(0.3)
    with pytest.raises(ValueError, match=r"being written by progpo eval \(pid \d+\)"):
        evaluate(config, progress=False)
    first.join(120)
    records = _lines(tmp_path)
    assert sorted(r["task_index"] for r in records) == list(range(6))


def test_a_huge_completion_is_cut_in_the_trajectory(endpoint, tmp_path):
    """A 2 MB answer is stored up to MAX_STORED_OUTPUT_CHARS (before: in full, 126 MB for 12 steps)."""
    from tests.agents.agents_toy_envs import hint_policy

    endpoint.policy = lambda messages, body: hint_policy(messages, body) + "x" * 2_000_000
    assert main(_argv(endpoint.base_url, tmp_path, "--episodes", "1", "--max-steps", "2")) == 0
    steps = _lines(tmp_path)[0]["trajectory"]
    assert all(len(s["raw_output"]) == MAX_STORED_OUTPUT_CHARS for s in steps)
    assert all(s["raw_output_chars"] > 2_000_000 for s in steps)
    assert (tmp_path / "trajectories.jsonl").stat().st_size < 4 * MAX_STORED_OUTPUT_CHARS * len(steps)


COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "<action>look</action>"},
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def test_ctrl_c_stops_eval_at_once_and_keeps_the_finished_episodes(trickling_server, tmp_path):
    """SIGINT while a request trickles: the run ends within a second or so, with the finished episodes on disk
    (before: SIGINT was ignored for 40 s, close() waited for the stuck request)."""
    server = trickling_server(["/chat/completions"], after=2, reply=COMPLETION)
    out = tmp_path / "run"
    argv = [sys.executable, "-c", EVAL_CLI, *_argv(server.url + "/v1", out, "--episodes", "6")]
    argv += ["--num-envs", "2", "--max-steps", "1", "--concurrency", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Its output goes to a file, not a pipe: a helper process of the run's (multiprocessing's resource
    # tracker) may hold a pipe open after the run itself has ended, and the test times the run's own exit.
    stderr_file = tmp_path / "stderr.txt"
    with stderr_file.open("w") as stderr:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(server.requests) < 3:  # the third request is stuck
        time.sleep(0.05)
    assert len(server.requests) >= 3, stderr_file.read_text()[-3000:]
    time.sleep(0.5)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    elapsed = time.monotonic() - started
    err = stderr_file.read_text()
    assert process.returncode == 130, err
    assert elapsed < 5.0, f"took {elapsed:.2f} s to stop"  # within a second on an idle machine (before: 40 s)
    assert "interrupted; 2 finished episodes are kept" in err
    assert len(_lines(out)) == 2


def test_ctrl_c_line_starts_on_its_own_line_after_the_progress_bar(trickling_server, tmp_path):
    """Issue 39, item 7: at a terminal the Ctrl-C line came glued onto the progress bar's last state
    (``eval ...: 33%|...| 2/6 [...]progpo eval: interrupted; ...``): the bar is now closed however the run
    ends, so the line starts on its own. The run's stderr is a pseudo-terminal, as at a user's terminal (to a
    file, tqdm ends every update with a newline)."""
    import fcntl
    import pty
    import struct
    import termios

    server = trickling_server(["/chat/completions"], after=2, reply=COMPLETION)
    out = tmp_path / "run"
    argv = [sys.executable, "-c", EVAL_CLI, *_argv(server.url + "/v1", out, "--episodes", "6")]
    argv.remove("--no-progress")  # the bar, as a user sees it
    argv += ["--num-envs", "2", "--max-steps", "1", "--concurrency", "2"]
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's width
    process = subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the run ended: the terminal is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(server.requests) < 3:  # the third request is stuck
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    reader.join(10)
    os.close(controller)
    err = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 130, err
    assert "eval agents-test/ToyALFWorld-v0" in err and "\r" in err  # the bar, redrawn in place
    line = "progpo eval: interrupted; 2 finished episodes are kept"
    assert line in err
    before = err[: err.index(line)]
    assert before.endswith("\n"), repr(before[-200:])  # not glued onto the bar


def test_an_uncached_hub_id_is_one_line_and_no_network(tmp_path):
    """`--model org/name` not in the local cache: one line with the fix, and no request to the hub (before:
    the transformers agent asked the hub for it)."""
    hits: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            hits.append(conn.recv(1024))
            conn.close()

    threading.Thread(target=record, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": f"http://127.0.0.1:{listener.getsockname()[1]}", "HF_HOME": str(tmp_path / "hf")}
    argv = [sys.executable, "-c", EVAL_CLI, "--env", TOY, "--agent", "transformers"]
    argv += ["--model", "someorg/some", "--out", str(tmp_path / "run"), "--episodes", "1", "--no-progress"]
    try:
        result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        listener.close()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not in the local Hugging Face cache" in lines[0] and "hf download" in lines[0]
    assert hits == []


def test_an_env_server_lost_mid_run_errors_its_episodes_and_the_rest_play_on(tmp_path):
    """Two env servers, one stopped after the first step: the episodes in flight on it are recorded with their
    error (not scored), the next batch plays all its episodes on the server left, the summary shows each
    server's share; a rerun plays the errored tasks again."""
    from agents.scripted import RandomAgent
    from tests.progpo_envs.server.hosting_helpers import TOY_ENV_ID, serve_toy

    servers = [serve_toy(num_workers=1) for _ in range(2)]

    class StoppingAgent(RandomAgent):
        acts = 0

        def act(self, observations, infos, active=None):
            StoppingAgent.acts += 1
            if StoppingAgent.acts == 2:
                servers[1].stop()
            return super().act(observations, infos, active)

    urls = ",".join(server.url for server in servers)
    config = EvalConfig(
        env_id=TOY_ENV_ID,
        agent="random",
        out_dir=str(tmp_path),
        episodes=8,
        num_envs=4,
        env_url=urls,
        env_kwargs={"retries": 1, "backoff": 0.05},
        max_errors=4,
    )
    try:
        summary = evaluate(config, StoppingAgent(), progress=False)
        errored = [r for r in _lines(tmp_path) if "error" in r]
        assert summary["errors"] == 2 and summary["episodes"] == 6 and not summary["failed"]
        assert sorted(r["task_index"] for r in errored) == [1, 3]  # slots 1 and 3 played on the second server
        assert all(servers[1].url in r["error"] for r in errored)
        shares = {s["url"]: s for s in summary["servers"]}
        assert shares[servers[1].url]["state"] == "down" and shares[servers[1].url]["failed_episodes"] == 2
        assert (
            shares[servers[1].url]["lost_groups"] == 2 and shares[servers[0].url]["groups"] == 4
        )  # all there
        assert "## Env servers" in (tmp_path / "report.md").read_text()
        summary = evaluate(config, RandomAgent(), progress=False)
        assert summary["errors"] == 0 and summary["episodes"] == 8
    finally:
        servers[0].stop()
