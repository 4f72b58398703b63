"""Run folders (issue 38, item 3): ``progpo train`` and ``progpo eval`` take one lock, so a folder has one
writer whichever command came first, and a folder neither can write is one line, exit status 2.

Every case runs the real command line (``python -m progpo.cli``) in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from progpo_base.folder_lock import LOCK_FILE
from tests.paths import REPO_ROOT
from tests.training.training_helpers import TINY_OVERRIDES, subprocess_env

#: The toy ALFWorld of the tests, for ``progpo eval`` (``module:id``: the CLI imports the module first).
EVAL_ENV = "progpo_envs.testing:progpo-test/ToyALFWorld-v0"
#: A training that takes minutes on the toy env (3 s a step), refused or not, with no warm start or
#: held-out evaluation before its first iteration.
SLOW_TRAIN = ("iterations=6", "warm_start.enabled=false", "eval.num_tasks=0", "env.kwargs={step_delay: 3.0}")


def _train(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "progpo.cli", "train", *TINY_OVERRIDES, f"run_dir={run_dir}", *extra]


def _eval(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "progpo.cli", "eval", "--env", EVAL_ENV, "--agent", "expert", "--out", str(out),
        "--no-progress", *extra,
    ]  # fmt: skip


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = subprocess_env()
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def _start(argv: list[str]) -> subprocess.Popen:
    """The command in the background, its stderr kept (:func:`_wait_for` shows it when it ends first)."""
    return subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_one_line_refusal(done: subprocess.CompletedProcess, prog: str, *phrases: str) -> None:
    """Exit status 2, one line on stderr that starts with ``prog: error:`` and says ``phrases``; no output."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.startswith(f"{prog}: error: ") and done.stdout == "", done.stderr
    for phrase in phrases:
        assert phrase in done.stderr, done.stderr


def _unwritable(kind: str, tmp_path: Path) -> Path:
    """A run folder this process cannot write, root included (chmod does not stop root: it may write any
    file whatever its mode, so the tests use what the kernel refuses to everyone)."""
    if kind == "under a file":  # no folder can be made under a file (ENOTDIR), whoever asks
        (tmp_path / "a-file").write_text("not a folder\n")
        return tmp_path / "a-file" / "run"
    # sysfs holds only the entries the kernel made: creating a file or folder there is refused (EACCES,
    # EPERM; EROFS where a container mounts it read-only) to every user, root included
    if not os.path.ismount("/sys"):
        pytest.skip("no /sys mounted here")
    return Path("/sys")


@pytest.mark.parametrize("kind", ["under a file", "sysfs"])
def test_an_unwritable_run_folder_is_one_line_and_exit_2(tmp_path, kind):
    """Before (main at 0fde1db): ``progpo train`` died with a ``PermissionError`` (sysfs) or a
    ``NotADirectoryError`` (under a file) traceback, exit status 1; ``progpo eval`` already said one line."""
    folder = _unwritable(kind, tmp_path)
    train = _run(_train(folder, "iterations=1"))
    _assert_one_line_refusal(train, "progpo train", f"cannot write in {folder}", "give another run_dir")
    evaluation = _run(_eval(folder, "--episodes", "1"))
    under_a_file = kind == "under a file"
    why = f"{folder.parent} is a file, not a folder" if under_a_file else f"cannot write in {folder}"
    _assert_one_line_refusal(evaluation, "progpo eval", why)


def _wait_for(path: Path, process: subprocess.Popen, what: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"{what} ended first: {process.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"no {path.name} from {what} within {seconds} s"
        time.sleep(0.1)


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.communicate(timeout=60)


def test_a_train_on_a_folder_an_eval_is_writing_is_refused(tmp_path):
    """F8. Before (main at 0fde1db): the two took differently named locks, the training ran and the
    evaluation then overwrote its ``summary.json``."""
    out = tmp_path / "run"
    # Steps of 10 min: the evaluation holds the folder until the test stops it. (The toy env used to ignore
    # step_delay: the evaluation ended within a second or two, and a training that reached the lock after it
    # read "holds the files of a progpo eval run": .ci/run, twice.)
    evaluation = _start(_eval(out, "--episodes", "8", "--env-arg", "step_delay=600"))
    try:
        _wait_for(out / "run.json", evaluation, "progpo eval")  # written once it holds the folder
        train = _run(_train(out, "iterations=0", "warm_start.enabled=false", "eval.num_tasks=0"))
        _assert_one_line_refusal(
            train, "progpo train", f"{out} is being written by progpo eval (pid {evaluation.pid})"
        )
        assert evaluation.poll() is None, "the evaluation ended before the training was refused"
        assert not (out / "config.yaml").exists() and not (out / "metrics.jsonl").exists()  # nothing written
        assert (out / LOCK_FILE).read_text() == f"progpo eval (pid {evaluation.pid})\n"
    finally:
        _stop(evaluation)


def test_an_eval_on_a_run_dir_a_train_is_writing_is_refused(tmp_path):
    """F8 the other way round. Before (main at 0fde1db): the evaluation ran, writing ``run.json``,
    ``trajectories.jsonl`` and a ``summary.json`` into the live run dir."""
    run_dir = tmp_path / "run"
    train = _start(_train(run_dir, *SLOW_TRAIN))
    try:
        _wait_for(run_dir / "config.yaml", train, "progpo train")  # written once it holds the run dir
        evaluation = _run(_eval(run_dir, "--episodes", "1"))
        _assert_one_line_refusal(
            evaluation, "progpo eval", f"{run_dir} is being written by progpo train (pid {train.pid})"
        )
        assert train.poll() is None, "the training ended before the evaluation was refused"
        written = {"run.json", "trajectories.jsonl", "summary.json", "report.md"}
        assert not written & {p.name for p in run_dir.iterdir()}  # nothing of the evaluation's
    finally:
        _stop(train)


def test_a_folder_keeps_the_command_that_wrote_it(tmp_path):
    """One writer after the first has ended, too: a training is refused on an evaluation's folder and an
    evaluation on a training's, while each command continues its own (before, main at 0fde1db: each ran
    and overwrote the other's ``summary.json``)."""
    evaluated, trained = tmp_path / "eval", tmp_path / "train"
    assert _run(_eval(evaluated, "--episodes", "1")).returncode == 0
    quick_train = ("iterations=0", "warm_start.enabled=false", "eval.num_tasks=0")
    assert _run(_train(trained, *quick_train)).returncode == 0
    summaries = {folder: (folder / "summary.json").read_bytes() for folder in (evaluated, trained)}
    refused = _run(_train(evaluated, *quick_train))
    _assert_one_line_refusal(refused, "progpo train", f"{evaluated} holds the files of a progpo eval run")
    refused = _run(_eval(trained, "--episodes", "1"))
    _assert_one_line_refusal(refused, "progpo eval", f"{trained} holds the files of a progpo train run")
    assert {folder: (folder / "summary.json").read_bytes() for folder in summaries} == summaries
    assert _run(_eval(evaluated, "--episodes", "2")).returncode == 0  # its own command goes on
