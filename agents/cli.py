"""``progpo eval``: score an agent on a text env and write trajectories, summary and report.

Its config is :class:`agents.evaluate.EvalConfig`, read as ``progpo train`` reads its own
(:mod:`progpo_base.config`): defaults, then a ``--config`` YAML file, then ``key=value`` and
``section.key=value`` overrides (``openai.max_retries=2``; ``--help-config`` lists every key), then the
short flags of the common keys (``--env``, ``--agent``, ``--out``, ``--episodes``, ``--model``, ...:
:data:`ALIASES`).

Where the env runs: in this process by default; ``--env-url`` plays it on env servers (``progpo serve``),
any env alike; ``--shop-url`` runs ``progpo/WebShop-v0`` here against a WebShop site (``progpo webshop
serve``). Each URL is checked before anything is built (:mod:`agents.endpoints`): the wrong kind of server, an
env it does not host, or nothing listening (``--base-url`` too) is one line, exit status 2.

Example:
    progpo eval --env progpo/ALFWorld-v0 --agent expert --split valid_seen --episodes 20 --out runs/expert
    progpo eval --env progpo/WebShop-v0 --env-url http://127.0.0.1:8001 --agent random --out runs/ws-remote
    progpo eval --env progpo/ALFWorld-v0 --agent transformers --model models/SmolLM2-135M-Instruct \\
        --mode guided --threads 1 --episodes 32 --out runs/smollm2-guided
    OPENAI_API_KEY=... progpo eval --env progpo/WebShop-v0 --agent openai --model gpt-4o-mini \\
        --base-url https://api.openai.com/v1 --episodes 50 --concurrency 8 --out runs/gpt openai.max_retries=2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agents.base import AnswerMode
from agents.evaluate import LLM_AGENTS, TRAJECTORIES_FILE, AgentKind, EvalConfig, evaluate
from agents.prompts import style_names
from progpo_base.config import (
    ALIASED,
    ConfigError,
    add_aliases,
    alias_flags,
    field_table,
    from_mapping,
    parse_override,
    read_yaml_mapping,
    set_dotted,
)
from progpo_base.usage import CommandParser, UsageError, existing_dir, one_of, report

PROG = "progpo eval"

#: Short flags -> the config keys they set (several keys: the same value for each agent's section).
ALIASES = {
    "--env": "env_id",
    "--agent": "agent",
    "--mode": "mode",
    "--out": "out_dir",
    "--split": "split",
    "--episodes": "episodes",
    "--task-order": "task_order",
    "--data-dir": "data_dir",
    "--env-url": "env_url",
    "--shop-url": "shop_url",
    "--env-kind": "env_kind",
    "--env-arg": "env_kwargs.*",
    "--seed": "seed",
    ("--num-envs", "--batch"): "num_envs",
    "--vector-mode": "vector_mode",
    "--max-steps": "max_steps",
    "--max-errors": "max_errors",
    "--history-length": "prompt.history_length",
    "--template": "prompt.template",
    "--max-prompt-chars": "prompt.max_prompt_chars",
    "--model": ("openai.model", "transformers.model_path"),
    "--base-url": "openai.base_url",
    "--api-key-env": "openai.api_key_env",
    "--concurrency": "openai.concurrency",
    "--timeout": "openai.timeout_s",
    "--temperature": ("openai.temperature", "transformers.temperature"),
    "--max-tokens": ("openai.max_tokens", "transformers.max_new_tokens"),
    "--device": "transformers.device",
    "--batch-size": "transformers.batch_size",
    "--threads": "transformers.threads",
}


def build_parser() -> CommandParser:
    """The ``progpo eval`` argument parser."""
    parser = CommandParser(
        prog=PROG,
        description="Score an agent on a text env and write trajectories, summary and report; rerun with the "
        "same --out to resume. Every key of the config can be set as key=value (--help-config lists them); "
        "the flags set the common ones.",
    )
    parser.add_argument("--config", help="YAML file of config keys (read before the overrides and flags)")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. openai.max_retries=2"
    )
    add_aliases(parser, EvalConfig, ALIASES)
    return parser


def load_eval_config(args: argparse.Namespace) -> EvalConfig:
    """The run's :class:`EvalConfig`: the ``--config`` file, then the ``key=value`` overrides, then the flags
    (each in command-line order)."""
    data = read_yaml_mapping(args.config) if args.config else {}
    for key, value in [parse_override(text) for text in args.overrides] + list(getattr(args, ALIASED) or []):
        set_dotted(data, key, value)
    return from_mapping(EvalConfig, data)


def _check_env(env_id: str) -> None:
    """``env_id`` is registered (``module:id``: once ``module`` is imported, as Gymnasium does)."""
    import gymnasium as gym

    from agents.envs import env_spec

    try:
        env_spec(env_id)
    except ImportError as error:
        raise UsageError(f"--env {env_id}: cannot import the module that registers it: {error}") from None
    except gym.error.Error:
        name = env_id.rpartition(":")[2]
        raise one_of("env", name, sorted(i for i in gym.registry if i.startswith("progpo/"))) from None


def _valid_splits(env_id: str, env_kwargs: dict) -> list[str] | None:
    """The splits the env can play with ``env_kwargs`` here (:func:`agents.envs.listed_splits`); an env
    that lists none here is a usage error."""
    from agents.envs import listed_splits

    splits = listed_splits(env_id, env_kwargs)
    if splits is not None and not splits:
        where = f" with --data-dir {env_kwargs['data_dir']}" if env_kwargs.get("data_dir") else ""
        raise UsageError(f"{env_id} has no splits here{where}: give the folder that contains its data")
    return splits


def _check_out(out: str) -> None:
    """``--out`` must be a folder this user can write in (or create)."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():
        raise UsageError(f"--out {out}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: cannot write in {existing} (permission denied)")


def _check_model(agent: str, model: str | None) -> None:
    """A transformers model must be a local folder or a hub id already in the local Hugging Face cache:
    ``progpo eval`` never downloads (no network at run time)."""
    if AgentKind(agent) is not AgentKind.TRANSFORMERS or model is None or Path(model).expanduser().exists():
        return
    looks_local = model.startswith(("/", ".", "~")) or model.count("/") > 1 or model.endswith("/")
    if looks_local:
        raise UsageError(f"--model {model}: no such model folder (a folder with config.json, or a hub id)")
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid repo id either
        cached = None
    if not isinstance(cached, str):
        raise UsageError(
            f"--model {model}: no such folder, and not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); progpo eval does not download models: run `hf download {model}` "
            "where the hub is reachable, or give the model's folder"
        )


def _check_endpoints(config: EvalConfig) -> None:
    """Each URL given is the kind of server its flag names and answers (:mod:`agents.endpoints`)."""
    from agents import endpoints
    from agents.envs import accepts_url, env_spec
    from progpo_envs.core.registration import REMOTE_ENV_ID
    from progpo_envs.server.fleet import server_urls

    if config.env_url is not None and config.shop_url is not None:
        raise UsageError(
            "--env-url and --shop-url: give one (--env-url plays the env on an env server, --shop-url runs "
            "progpo/WebShop-v0 here against a WebShop site)"
        )
    if config.env_url is not None:
        try:
            urls = server_urls(config.env_url)
        except ValueError as error:
            raise UsageError(f"--env-url {config.env_url}: {error}") from None
        remote = config.env_id.rpartition(":")[2] == REMOTE_ENV_ID
        hosted = config.env_kwargs.get("env_id") if remote else env_spec(config.env_id).id
        for url in urls:
            endpoints.check_env_server("--env-url", url, hosted)
    if config.shop_url is not None:
        if not accepts_url(config.env_id):
            raise UsageError(
                f"--shop-url names a WebShop site (for progpo/WebShop-v0); {config.env_id} plays on none"
            )
        endpoints.check_shop_site("--shop-url", config.shop_url)
    if AgentKind(config.agent) is AgentKind.OPENAI and config.openai.base_url:
        endpoints.check_listening("--base-url", config.openai.base_url)


def check_config(config: EvalConfig) -> None:
    """What can be checked before any env or model is built (:class:`UsageError` otherwise)."""
    _check_env(config.env_id)
    if config.env_kind is not None and config.env_kind not in style_names():
        raise one_of("--env-kind prompt style", config.env_kind, style_names())
    env_kwargs = dict(config.env_kwargs)
    if config.data_dir is not None:
        env_kwargs["data_dir"] = config.data_dir
    existing_dir("--data-dir", config.data_dir)
    if config.split is not None and config.env_url is None:  # a remote env's server knows its own splits
        splits = _valid_splits(config.env_id, env_kwargs)
        if splits is not None and config.split not in splits:
            raise one_of(f"{config.env_id} split", config.split, splits)
    if config.episodes is not None and config.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {config.episodes}")
    if not config.max_errors >= 0:
        raise UsageError(f"--max-errors must be >= 0, got {config.max_errors}")
    _check_out(config.out_dir)
    _check_model(config.agent, config.model)
    if config.mode != AnswerMode.FREE.value and AgentKind(config.agent) not in LLM_AGENTS:
        raise UsageError(
            f"--mode {config.mode} is for the LLM agents (openai, transformers), not {config.agent}"
        )
    threads = config.transformers.threads
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    _check_endpoints(config)


def _spelled(error: ConfigError) -> str:
    """The error with the flag of its key, for a user who sets it with the flag."""
    flag = alias_flags(ALIASES).get(error.key or "")
    return f"{error} (flag {flag})" if flag else str(error)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``progpo eval``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    if args.help_config:
        print("\n".join(field_table(EvalConfig)))
        return 0
    try:
        config = load_eval_config(args)
    except ConfigError as error:
        return report(PROG, UsageError(_spelled(error)))
    except FileNotFoundError as error:  # --config names no file
        return report(PROG, error)
    try:
        check_config(config)
    except UsageError as error:
        return report(PROG, error)
    try:
        summary = evaluate(config, progress=not args.no_progress)
    except KeyboardInterrupt:
        trajectories = Path(config.out_dir) / TRAJECTORIES_FILE
        kept = sum(1 for _ in trajectories.open("rb")) if trajectories.exists() else 0
        print(
            f"progpo eval: interrupted; {kept} finished episodes are kept in {trajectories}: "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    except (ValueError, RuntimeError, OSError) as error:  # bad settings, an unreachable server or model
        return report(PROG, error)
    keys = ("episodes", "errors", "success_rate", "mean_score", "mean_steps", "invalid_action_rate", "tokens")
    print(json.dumps({k: summary[k] for k in keys} | {"per_task_type": summary["per_task_type"]}, indent=2))
    print(f"wrote {config.out_dir}/summary.json, report.md, success.png, trajectories.jsonl")
    if summary["failed"]:
        print(
            f"progpo eval: error: {summary['errors']} of {summary['episodes_planned']} episodes ended with "
            f"an agent error, more than --max-errors allows ({summary['allowed_errors']}); the first: "
            f"{summary['first_error']} (they are in {config.out_dir}/{TRAJECTORIES_FILE}; rerun the same "
            "command to play them again)",
            file=sys.stderr,
        )
        return 1
    if summary["errors"]:
        print(
            f"progpo eval: {summary['errors']} episodes ended with an agent error (within --max-errors); "
            "rerun the same command to play them again",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
