"""Every ``progpo`` command answers a user error with one line naming the valid choices and exit status 2,
and its ``--help`` helps every flag and shows the defaults (:mod:`progpo_base.usage`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from agents.cli import build_parser as eval_parser
from progpo_envs.alfworld.cli import build_parser as alfworld_parser
from progpo_envs.server.cli import build_parser as serve_parser
from webshop_server.cli import build_parser as webshop_parser

EVAL = ["eval", "--agent", "expert"]
ALFWORLD = "progpo/ALFWorld-v0"

#: (arguments, what the one line must say) for each user error, run through the real `progpo` command.
ERROR_CASES = [
    (["evl"], "did you mean 'eval'?"),
    ([*EVAL, "--env", "progpo/Alfworld-v0", "--out", "{tmp}/o"], "did you mean 'progpo/ALFWorld-v0'?"),
    ([*EVAL, "--env", "progpo/WebShop-v0", "--split", "valid_seen", "--out", "{tmp}/o"], "test, train, all"),
    (
        [*EVAL, "--env", ALFWORLD, "--split", "valid_sen", "--out", "{tmp}/o"],
        "(did you mean 'valid_seen'?); choose from train, valid_seen, valid_unseen",
    ),
    (
        [*EVAL, "--env", ALFWORLD, "--data-dir", "{tmp}/none", "--out", "{tmp}/o"],
        "--data-dir {tmp}/none does",
    ),
    ([*EVAL, "--env", ALFWORLD, "--out", "{tmp}/a_file/o"], "{tmp}/a_file is a file, not a folder"),
    (
        [
            "eval",
            "--agent",
            "transformers",
            "--model",
            "./models/none",
            "--env",
            ALFWORLD,
            "--out",
            "{tmp}/o",
        ],
        "--model ./models/none: no such model folder",
    ),
    (["eval", "--agent", "expret", "--env", ALFWORLD, "--out", "{tmp}/o"], "choose from 'expert', 'random'"),
    ([*EVAL, "--env", ALFWORLD, "--out", "{tmp}/o", "openai.max_retrie=2"], "unknown key 'openai.max_"),
    ([*EVAL, "--out", "{tmp}/o"], "env_id is required"),
    (["train", "--algo", "ppo"], "argument --algo: invalid choice: 'ppo'"),
    (["train", "rollout.group_sise=4"], "unknown key 'rollout.group_sise'"),
    (["serve", "--env", "progpo/Alfworld-v0"], "(did you mean 'progpo/ALFWorld-v0'?); choose from"),
    (["serve", "--agentgym-mappings", "{tmp}/none"], "--agentgym-mappings {tmp}/none does not exist"),
    (["serve", "--idle-timeout", "-1"], "--idle-timeout must be >= 0 (0: never expire)"),
    (["webshop", "serve", "--data-dir", "{tmp}/none"], "--data-dir {tmp}/none does not exist"),
    (["alfworld", "list", "--split", "valid_sen"], "did you mean 'valid_seen'?"),
    (["alfworld", "play", "--data-dir", "{tmp}/none"], "--data-dir {tmp}/none does not exist"),
]


@pytest.mark.parametrize("args, expected", ERROR_CASES, ids=[" ".join(a[:3]) for a, _ in ERROR_CASES])
def test_user_error_is_one_line_and_exit_2(args, expected, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}  # generated games: known splits
    done = subprocess.run(
        [sys.executable, "-m", "progpo.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr and done.stdout == "", done.stderr
    assert lines[0].startswith("progpo") and ": error: " in lines[0]
    assert expected.replace("{tmp}", str(tmp_path)) in lines[0]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {"progpo eval": eval_parser(), "progpo serve": serve_parser()}
    for top in (alfworld_parser(), webshop_parser()):
        subcommands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        for name, parser in subcommands.choices.items():
            if parser.add_help:  # `generate` forwards to its own parser (checked below through the command)
                parsers[f"{top.prog} {name}"] = parser
    return parsers


@pytest.mark.parametrize("name, parser", list(_parsers().items()))
def test_help_helps_every_flag_and_shows_defaults(name, parser):
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name} {action.option_strings} has no help"
        shown = action.default not in (None, False, []) and action.default != argparse.SUPPRESS
        if shown and "%(default)" not in action.help:
            assert f"(default: {action.default})" in " ".join(text.split()), (name, action.dest)
    assert "(default: None)" not in text and "``" not in text and "above" not in text


@pytest.mark.parametrize("command", [["alfworld", "generate"], ["webshop", "generate"]])
def test_forwarded_subcommands_help_and_one_line_errors(command):
    shown = subprocess.run(
        [sys.executable, "-m", "progpo.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0 and "(default: 0)" in shown.stdout and "(default: None)" not in shown.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "progpo.cli", *command, "--n", "many"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
