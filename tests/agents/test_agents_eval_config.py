"""``progpo eval``'s command line reads :class:`agents.evaluate.EvalConfig` as ``progpo train`` reads its own:
a ``--config`` file, ``section.key=value`` overrides, a generated ``--help-config``, one-line errors (exit 2),
and the short flags of every key it had before, which set the same fields."""

from __future__ import annotations

import dataclasses

import pytest

from agents.cli import ALIASES, build_parser, load_eval_config, main
from agents.evaluate import EvalConfig
from progpo_base.config import ConfigError, find_field

TOY = "agents-test/ToyALFWorld-v0"


def _config(argv: list[str]) -> EvalConfig:
    return load_eval_config(build_parser().parse_intermixed_args(argv))


def test_flags_set_the_same_fields_as_their_keys():
    flags = _config(
        [
            *("--env", TOY, "--agent", "openai", "--out", "runs/x", "--episodes", "6", "--seed", "3"),
            *("--model", "policy", "--base-url", "http://127.0.0.1:8000/v1", "--timeout", "5"),
            *(
                "--temperature",
                "0.5",
                "--max-tokens",
                "64",
                "--template",
                "react",
                "--env-arg",
                "num_generated=6",
            ),
            *("--num-envs", "2", "--max-errors", "1"),
        ]
    )
    keys = _config(
        [
            *("env_id=" + TOY, "agent=openai", "out_dir=runs/x", "episodes=6", "seed=3"),
            *("openai.model=policy", "openai.base_url=http://127.0.0.1:8000/v1", "openai.timeout_s=5"),
            *("openai.temperature=0.5", "openai.max_tokens=64", "prompt.template=react"),
            *("env_kwargs.num_generated=6", "num_envs=2", "max_errors=1"),
            *(
                "transformers.model_path=policy",
                "transformers.temperature=0.5",
                "transformers.max_new_tokens=64",
            ),
        ]
    )
    assert flags == keys
    assert (
        flags.openai.timeout_s == 5.0 and flags.env_kwargs == {"num_generated": 6} and flags.model == "policy"
    )
    assert flags.copies() == 2 and flags.allowed_errors(6) == 1


def test_every_flag_names_a_key_and_helps_with_its_doc():
    """The aliases are the only flags for config keys: each one's field exists (the parser is built from
    them) and its help is the field's doc."""
    text = " ".join(build_parser().format_help().split())
    for flags, keys in ALIASES.items():
        flag = flags if isinstance(flags, str) else flags[0]
        key = keys if isinstance(keys, str) else keys[0]
        assert flag in text
        if not key.endswith(".*"):
            field, _ = find_field(EvalConfig, key)
            assert " ".join(field.metadata["doc"].split())[:40] in text, flag


def test_config_file_then_overrides_then_flags(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text(
        f"env_id: {TOY}\nagent: openai\nout_dir: runs/x\nopenai:\n  model: policy\n  max_retries: 1\n"
        "  concurrency: 4\n"
    )
    config = _config(
        ["--config", str(path), "openai.max_retries=2", "openai.concurrency=8", "--concurrency", "3"]
    )
    assert (config.openai.model, config.openai.max_retries, config.openai.concurrency) == ("policy", 2, 3)
    assert config.openai.timeout_s == 60.0  # unset keys keep the section's defaults


def test_keys_that_had_no_flag_are_reachable():
    config = _config(
        [
            "--env",
            TOY,
            "--agent",
            "openai",
            "--out",
            "o",
            "openai.max_retries=0",
            "prompt.require_think=false",
        ]
    )
    assert config.openai.max_retries == 0 and config.prompt.require_think is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--agent", "expert", "--out", "o"], "env_id is required: registered env id"),
        (
            ["--env", TOY, "--agent", "expert", "--out", "o", "openai.max_retrie=2"],
            "valid keys here: openai.model",
        ),
        (["--env", TOY, "--out", "o", "agent=expret"], "agent 'expret' is not one of expert, random"),
        (["--env", TOY, "--agent", "expert", "--out", "o", "seed=x"], "seed must be an integer, got 'x'"),
        (["--env", TOY, "--agent", "expert", "--out", "o", "episodes=abc"], "episodes must be an integer"),
    ],
)
def test_config_mistakes_are_one_line_naming_the_key_and_its_flag(argv, message, capsys):
    assert main([*argv, "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("progpo eval: error: ") and message in lines[0], lines
    with pytest.raises(ConfigError):
        _config(argv)


def test_missing_key_names_its_flag(capsys):
    assert main(["--agent", "expert", "--out", "o"]) == 2
    assert "(flag --env)" in capsys.readouterr().err


def test_help_config_lists_every_key_with_default_and_doc(capsys):
    assert main(["--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = {line.split()[0]: line for line in lines}
    assert "required" in keys["env_id"] and "'OPENAI_API_KEY'" in keys["openai.api_key_env"]
    assert "retries after the first attempt" in keys["openai.max_retries"]
    assert {"prompt.template", "transformers.model_path", "transformers.max_prompt_tokens"} <= set(keys)
    assert len(keys) == len(lines) == len(dataclasses.fields(EvalConfig)) - 3 + 4 + 13 + 9


def test_the_python_api_keeps_its_required_fields():
    with pytest.raises(TypeError):
        EvalConfig(env_id=TOY, agent="expert")  # out_dir is required, as before


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--agent", "random", "--mode", "guided"],
            "--mode guided is for the LLM agents (openai, transformers)",
        ),
        (["--agent", "transformers", "--model", ".", "--threads", "0"], "--threads must be >= 1, got 0"),
        (
            ["--agent", "openai", "--model", "m", "mode=greedy"],
            "mode 'greedy' is not one of free, guided",
        ),
    ],
)
def test_answer_mode_and_threads_mistakes_are_one_line(argv, message, tmp_path, capsys):
    assert main(["--env", TOY, "--out", str(tmp_path / "o"), "--no-progress", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("progpo eval: error: ") and message in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_the_mode_and_threads_flags_set_their_keys():
    config = _config(
        ["--env", TOY, "--agent", "transformers", "--out", "o", "--mode", "guided", "--threads", "1"]
    )
    assert (config.mode, config.transformers.threads) == ("guided", 1)
    assert _config(["--env", TOY, "--agent", "openai", "--out", "o"]).mode == "free"  # the papers' default
