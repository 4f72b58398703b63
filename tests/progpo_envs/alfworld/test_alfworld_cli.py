"""``progpo alfworld list|play|generate``."""

from __future__ import annotations

import argparse

import pytest

from progpo_envs.alfworld import cli


def test_list_prints_every_task_and_a_summary(shared_alfworld_data, progpo_cache, capsys):
    assert cli.main(["list", "--split", "valid_seen", "--data-dir", str(shared_alfworld_data)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 141 and lines[-1].startswith("140 tasks in split 'valid_seen'")
    assert lines[0].split()[0] == "0"


def test_list_reports_a_missing_split(shared_alfworld_data, capsys):
    assert cli.main(["list", "--split", "nope", "--data-dir", str(shared_alfworld_data)]) == 2
    assert "choose from valid_seen, valid_train" in capsys.readouterr().err


def test_play_runs_a_scripted_session_to_a_win(generated_root, capsys):
    from progpo_envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split="train", data_dir=generated_root, expert=True)
    _, info = env.reset(options={"task_index": 0})
    commands = ["", "jump"]
    while True:
        commands.append(info["expert_action"])
        *_, terminated, _, info = env.step(info["expert_action"])
        if terminated:
            break
    feed = iter(commands)
    args = cli.build_parser().parse_args(
        ["play", "--split", "train", "--data-dir", str(generated_root), "--task", "0", "--hint"]
    )
    assert cli._play(args, read=lambda prompt: next(feed)) == 0
    out = capsys.readouterr().out
    assert "Nothing happens." in out and "expert: " in out and out.rstrip().endswith("[won; reward 10]")


def test_play_stops_on_quit_and_eof(generated_root):
    args = cli.build_parser().parse_args(["play", "--split", "train", "--data-dir", str(generated_root)])
    assert cli._play(args, read=lambda prompt: "quit") == 0

    def eof(prompt):
        raise EOFError

    assert cli._play(args, read=eof) == 0


def test_generate_forwards_to_the_generator(monkeypatch):
    seen = {}
    import progpo_envs.alfworld.generator as generator

    monkeypatch.setattr(generator, "generate_main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main(["generate", "--out", "x", "--n", "2"]) == 0
    assert seen["argv"] == ["--out", "x", "--n", "2"]


def test_parser_requires_a_command():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([])
    assert isinstance(cli.build_parser(), argparse.ArgumentParser)
