"""``progpo alfworld``: generate games, list a split's tasks, play a game in the terminal.

Examples::

    progpo alfworld generate --out data/alfworld_gen --n 36 --seed 0
    progpo alfworld list --split valid_seen --data-dir /data/alfworld
    progpo alfworld play --split valid_seen --data-dir /data/alfworld --task 3

A usage error (an unknown split, a data folder that does not exist) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable

from progpo_base.usage import CommandParser, UsageError, existing_dir, one_of, report
from progpo_envs.alfworld.data import load_tasks, resolve_data_dir, split_names
from progpo_envs.alfworld.task_types import TASK_TYPES


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--split",
        default="train",
        help="a folder of json_2.1.1 (generated games: train, valid_seen or valid_unseen)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder containing json_2.1.1/ (default: $ALFWORLD_DATA, else generated games)",
    )
    parser.add_argument(
        "--num-generated",
        type=int,
        default=None,
        help="games per split when generated games are used (default: 36)",
    )


def _list(args: argparse.Namespace) -> int:
    tasks = load_tasks(args.split, args.data_dir, num_generated=args.num_generated)
    counts = Counter(task.task_type for task in tasks)
    if not args.quiet:
        for index, task in enumerate(tasks):
            print(f"{index:5d}  {task.task_type:32s}  {task.task_id}")
    summary = ", ".join(f"{task_type}: {counts.get(task_type, 0)}" for task_type in TASK_TYPES)
    print(f"{len(tasks)} tasks in split {args.split!r} ({summary})")
    return 0


def _play(args: argparse.Namespace, read: Callable[[str], str] = input) -> int:
    from progpo_envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(
        split=args.split,
        data_dir=args.data_dir,
        max_steps=args.max_steps,
        expert=args.hint,
        num_generated=args.num_generated,
    )
    options = {"task_index": args.task} if args.task is not None else None
    observation, info = env.reset(seed=args.seed, options=options)
    print(f"[task {info['task_index']}: {info['task_id']} ({info['task_type']})]\n")
    print(observation)
    while True:
        print("\nadmissible: " + " | ".join(info["admissible_actions"]))
        if args.hint:
            print(f"expert: {info['expert_action']}")
        try:
            action = read("> ")
        except EOFError:
            print()
            return 0
        if action.strip() in {"quit", "exit"}:
            return 0
        observation, reward, terminated, truncated, info = env.step(action)
        print(observation)
        if terminated or truncated:
            print(f"\n[{'won' if info['won'] else 'step limit reached'}; reward {reward:g}]")
            return 0


def _generate(argv: list[str]) -> int:
    from progpo_envs.alfworld.generator import generate_main

    return generate_main(argv)


def build_parser() -> CommandParser:
    """The ``progpo alfworld`` argument parser (``generate`` forwards its arguments to the generator)."""
    parser = CommandParser(
        prog="progpo alfworld",
        description="ALFWorld tools: generate games, list a split's tasks, play a game.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "generate", help="generate verified games (see `progpo alfworld generate --help`)", add_help=False
    )
    list_parser = commands.add_parser("list", help="list the tasks of a split in their fixed order")
    _add_data_args(list_parser)
    list_parser.add_argument("--quiet", action="store_true", help="print only the summary line")
    play = commands.add_parser("play", help="play a game interactively (type `quit` to stop)")
    _add_data_args(play)
    play.add_argument("--task", type=int, default=None, help="task index (default: chosen by --seed)")
    play.add_argument("--seed", type=int, default=None, help="seed of the task choice")
    play.add_argument("--max-steps", type=int, default=50, help="step limit")
    play.add_argument("--hint", action="store_true", help="show the expert's next command")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``progpo alfworld <command> ...``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["generate"]:
        return _generate(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        existing_dir("--data-dir", args.data_dir)
        splits = split_names(args.data_dir)
        if args.split not in splits:
            where = resolve_data_dir(args.data_dir) or "generated games"
            raise one_of(f"split (in {where})", args.split, splits or ["none: no json_2.1.1/ folder there"])
        if args.command == "list":
            return _list(args)
        return _play(args)
    except (UsageError, FileNotFoundError, ValueError) as error:
        return report(f"progpo alfworld {args.command}", error)


if __name__ == "__main__":
    sys.exit(main())
