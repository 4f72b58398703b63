"""``progpo eval``: score an agent on a text env and write trajectories, summary and report.

Example:
    progpo eval --env progpo/ALFWorld-v0 --agent expert --split valid_seen --episodes 20 --out runs/expert
    OPENAI_API_KEY=... progpo eval --env progpo/WebShop-v0 --agent openai --model gpt-4o-mini \\
        --base-url https://api.openai.com/v1 --episodes 50 --num-envs 8 --out runs/gpt
"""

from __future__ import annotations

import argparse
import json
import sys

from agents.evaluate import AgentKind, EvalConfig, evaluate
from agents.prompts import EnvKind, PromptTemplate


def _key_value(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed: object = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key, parsed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="progpo eval",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--env", required=True, help="env id, e.g. progpo/ALFWorld-v0")
    parser.add_argument("--agent", required=True, choices=[k.value for k in AgentKind])
    parser.add_argument("--out", required=True, help="output directory (rerun with the same one to resume)")
    parser.add_argument("--split", help="env split (env default when omitted)")
    parser.add_argument(
        "--episodes", type=int, help="play tasks 0..N-1 (all tasks of the split when omitted)"
    )
    parser.add_argument("--data-dir", help="env data directory")
    parser.add_argument("--env-url", help="remote env server URL (passed to the env as url=)")
    parser.add_argument(
        "--env-kind", choices=[k.value for k in EnvKind], help="prompt style (default: from --env)"
    )
    parser.add_argument(
        "--env-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="extra env keyword argument (VALUE parsed as JSON when it can be); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-envs", "--batch", dest="num_envs", type=int, default=1, help="env copies stepped together"
    )
    parser.add_argument("--vector-mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--max-steps", type=int, help="steps per episode (env default when omitted)")
    parser.add_argument("--history-length", type=int, default=2)
    parser.add_argument("--template", choices=[t.value for t in PromptTemplate], default="default")
    parser.add_argument("--max-prompt-chars", type=int, default=13_000)
    parser.add_argument("--model", help="model name (openai) or checkpoint directory (transformers)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (openai)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request (openai)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=512, help="completion tokens per step")
    parser.add_argument("--device", help="torch device (transformers)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per forward pass (transformers)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``progpo eval``; returns the exit status."""
    args = build_parser().parse_args(argv)
    config = EvalConfig(
        env_id=args.env,
        agent=args.agent,
        out_dir=args.out,
        split=args.split,
        episodes=args.episodes,
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
    )
    try:
        summary = evaluate(config, progress=not args.no_progress)
    except (ValueError, RuntimeError) as error:
        print(f"progpo eval: error: {error}", file=sys.stderr)
        return 2
    keys = ("episodes", "success_rate", "mean_score", "mean_steps", "invalid_action_rate", "tokens")
    print(json.dumps({k: summary[k] for k in keys} | {"per_task_type": summary["per_task_type"]}, indent=2))
    print(f"wrote {args.out}/summary.json, report.md, success.png, trajectories.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
