"""``progpo eval``: score an agent on a text env and write trajectories, summary and report.

Example:
    progpo eval --env progpo/ALFWorld-v0 --agent expert --split valid_seen --episodes 20 --out runs/expert
    OPENAI_API_KEY=... progpo eval --env progpo/WebShop-v0 --agent openai --model gpt-4o-mini \\
        --base-url https://api.openai.com/v1 --episodes 50 --concurrency 8 --out runs/gpt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agents.evaluate import DEFAULT_MAX_ERRORS, TRAJECTORIES_FILE, AgentKind, EvalConfig, TaskOrder, evaluate
from agents.prompts import PromptTemplate, style_names
from webshop_server.usage import CommandParser, UsageError, existing_dir, one_of, report


def _key_value(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed: object = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key, parsed


def build_parser() -> CommandParser:
    """The ``progpo eval`` argument parser."""
    parser = CommandParser(
        prog="progpo eval",
        description="Score an agent on a text env and write trajectories, summary and report; rerun with the "
        "same --out to resume.",
    )
    parser.add_argument(
        "--env",
        required=True,
        help="env id, e.g. progpo/ALFWorld-v0 or progpo/WebShop-v0 (module:id imports the module that "
        "registers it first)",
    )
    parser.add_argument(
        "--agent", required=True, choices=[k.value for k in AgentKind], help="the agent to evaluate"
    )
    parser.add_argument("--out", required=True, help="output folder (rerun with the same one to resume)")
    parser.add_argument(
        "--split",
        help="env split: ALFWorld a folder of json_2.1.1 (train, valid_seen, valid_unseen, ...), WebShop "
        "test, train or all (default: the env's, train for both)",
    )
    parser.add_argument(
        "--episodes", type=int, help="play this many tasks in --task-order (default: every task of the split)"
    )
    parser.add_argument(
        "--task-order",
        choices=[o.value for o in TaskOrder],
        default=TaskOrder.STRATIFIED.value,
        help="which tasks --episodes plays: stratified takes each task type in turn (in-process ALFWorld; "
        "other envs keep the split's order), sequential plays tasks 0..N-1",
    )
    parser.add_argument("--data-dir", help="env data folder (ALFWorld: the folder containing json_2.1.1/)")
    parser.add_argument("--env-url", help="remote env server URL (passed to the env as url=)")
    parser.add_argument(
        "--env-kind",
        help="prompt style, by name: alfworld, webshop, text or a registered one (default: the one the env "
        "names in its metadata)",
    )
    parser.add_argument(
        "--env-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="extra env keyword argument (VALUE parsed as JSON when it can be); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed: task t is reset with seed + t")
    parser.add_argument(
        "--num-envs",
        "--batch",
        dest="num_envs",
        type=int,
        help="episodes played at once (default: --concurrency for openai, --batch-size for transformers, "
        "1 for the scripted agents; at most --episodes); the episodes do not depend on it",
    )
    parser.add_argument(
        "--vector-mode",
        choices=["sync", "async"],
        default="sync",
        help="env copies in this process (sync) or in subprocesses (async)",
    )
    parser.add_argument("--max-steps", type=int, help="steps per episode (default: the env's)")
    parser.add_argument("--history-length", type=int, default=2, help="past steps shown in LLM prompts")
    parser.add_argument(
        "--template",
        choices=[t.value for t in PromptTemplate],
        default="default",
        help="prompt template of the LLM agents",
    )
    parser.add_argument(
        "--max-prompt-chars", type=int, default=13_000, help="longest prompt (characters) of the LLM agents"
    )
    parser.add_argument("--model", help="model name (openai) or model folder / hub id (transformers)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="requests in flight (openai; 32 suits a local vLLM server)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds one request may take in all, a wall-clock deadline; then it is retried (openai)",
    )
    parser.add_argument(
        "--max-errors",
        type=float,
        default=DEFAULT_MAX_ERRORS,
        help="episodes that may end with an agent error (a request that failed for good) before the run "
        "fails (exit status 1): a share of the episodes below 1, a number from 1 up; errored episodes are "
        "recorded, not scored, and played again by a rerun",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--max-tokens", type=int, default=512, help="completion tokens per step")
    parser.add_argument("--device", help="torch device (transformers; default: cuda if available, else cpu)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per forward pass (transformers)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


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
    """The splits the env can play with ``env_kwargs`` here (its class's ``split_names``; ALFWorld: the
    data's folders, or the generated ones), or ``None`` when it does not list them."""
    from agents.envs import env_class, env_spec

    listed = getattr(env_class(env_id), "split_names", None)
    fixed = env_spec(env_id).kwargs or {}
    splits = listed(**{**fixed, **env_kwargs}) if callable(listed) else None
    if splits is not None and not splits:
        where = f" with --data-dir {env_kwargs['data_dir']}" if env_kwargs.get("data_dir") else ""
        raise UsageError(f"{env_id} has no splits here{where}: give the folder that contains its data")
    return None if splits is None else list(splits)


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


def check_args(args: argparse.Namespace) -> None:
    """What can be checked before any env or model is built (:class:`UsageError` otherwise)."""
    _check_env(args.env)
    if args.env_kind is not None and args.env_kind not in style_names():
        raise one_of("--env-kind prompt style", args.env_kind, style_names())
    env_kwargs = dict(args.env_arg)
    if args.data_dir is not None:
        env_kwargs["data_dir"] = args.data_dir
    existing_dir("--data-dir", args.data_dir)
    if args.split is not None and args.env_url is None:  # a remote env's server knows its own splits
        splits = _valid_splits(args.env, env_kwargs)
        if splits is not None and args.split not in splits:
            raise one_of(f"{args.env} split", args.split, splits)
    if args.episodes is not None and args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    if not args.max_errors >= 0:
        raise UsageError(f"--max-errors must be >= 0, got {args.max_errors}")
    _check_out(args.out)
    _check_model(args.agent, args.model)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``progpo eval``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except UsageError as error:
        return report("progpo eval", error)
    config = EvalConfig(
        env_id=args.env,
        agent=args.agent,
        out_dir=args.out,
        split=args.split,
        episodes=args.episodes,
        task_order=args.task_order,
        data_dir=args.data_dir,
        env_url=args.env_url,
        env_kind=args.env_kind,
        seed=args.seed,
        num_envs=args.num_envs,
        vector_mode=args.vector_mode,
        max_steps=args.max_steps,
        history_length=args.history_length,
        template=args.template,
        max_prompt_chars=args.max_prompt_chars,
        model=args.model,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        device=args.device,
        batch_size=args.batch_size,
        env_kwargs=dict(args.env_arg),
        max_errors=args.max_errors,
    )
    try:
        summary = evaluate(config, progress=not args.no_progress)
    except KeyboardInterrupt:
        trajectories = Path(args.out) / TRAJECTORIES_FILE
        kept = sum(1 for _ in trajectories.open("rb")) if trajectories.exists() else 0
        print(
            f"progpo eval: interrupted; {kept} finished episodes are kept in {trajectories}: "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        return 130
    except (ValueError, RuntimeError, OSError) as error:  # bad settings, an unreachable server or model
        return report("progpo eval", error)
    keys = ("episodes", "errors", "success_rate", "mean_score", "mean_steps", "invalid_action_rate", "tokens")
    print(json.dumps({k: summary[k] for k in keys} | {"per_task_type": summary["per_task_type"]}, indent=2))
    print(f"wrote {args.out}/summary.json, report.md, success.png, trajectories.jsonl")
    if summary["failed"]:
        print(
            f"progpo eval: error: {summary['errors']} of {summary['episodes_planned']} episodes ended with "
            f"an agent error, more than --max-errors allows ({summary['allowed_errors']}); the first: "
            f"{summary['first_error']} (they are in {args.out}/{TRAJECTORIES_FILE}; rerun the same command "
            "to play them again)",
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
