"""The ``progpo`` command: a thin dispatcher to each package's own command line.

Each subcommand lives in the package that owns it and is imported only when used, so ``progpo eval`` never
pays for torch and ``progpo --help`` is instant. A subcommand module exposes
``main(argv: list[str] | None) -> int``. The dispatcher sits above every layer (``docs/architecture.md``): it
names the packages' command modules, and nothing imports it.

Example:
    >>> main(["evl"])
    2
"""

from __future__ import annotations

import importlib
import sys

from progpo_base.usage import UsageError, one_of, report

#: subcommand -> (module with ``main(argv)``, one-line description)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "alfworld": ("progpo_envs.alfworld.cli", "ALFWorld tools: generate games, play, list tasks"),
    "webshop": ("webshop_server.cli", "WebShop tools: generate a catalog, serve the site and session API"),
    "serve": ("progpo_envs.server.cli", "host registered envs over HTTP (env server)"),
    "eval": ("agents.cli", "evaluate an agent (expert, random, openai, transformers, human) on an env"),
    "train": ("training.cli", "train a policy with group RL (ProGPO by default)"),
    "bench": ("benchmarks.cli", "run the quick benchmarks and refresh benchmarks/README.md"),
}


def _usage() -> str:
    lines = ["usage: progpo <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {description}" for name, (_, description) in SUBCOMMANDS.items()]
    lines += ["", "Run `progpo <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``progpo`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        return report("progpo", one_of("command", command, SUBCOMMANDS))
    module_name, _ = SUBCOMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return report(
                "progpo", UsageError(f"the '{command}' command is not in this installation ({exc})")
            )
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
