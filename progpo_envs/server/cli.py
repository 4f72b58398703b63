"""``progpo serve``: host registered envs over HTTP.

Example::

    progpo serve --env progpo/ALFWorld-v0 --port 8000 --workers 2 --max-instances 512 --idle-timeout 600 \\
        --env-kwargs 'progpo/ALFWorld-v0={"split": "valid_seen"}'

Then ``curl localhost:8000/ready`` and, from Python,
``gymnasium.make("progpo/Remote-v0", url="http://localhost:8000", env_id="progpo/ALFWorld-v0")``.
The AgentGym protocol (``/create``, ``/reset``, ``/step``, ...) is mounted at the root for the first ``--env``
when it is ALFWorld or WebShop (``--agentgym ENV_ID`` picks another, ``--agentgym none`` turns it off); it
scores as AgentGym's servers do (:mod:`progpo_envs.server.agentgym`). AgentGym's own ALFWorld test games
(ids 2420-2619) from real data::

    ALFWORLD_DATA=/data/alfworld progpo serve --env progpo/ALFWorld-v0 --idle-timeout 0 \\
        --agentgym-mappings AgentGym/agentenv-alfworld/configs

``--protocol openenv`` serves one env as an OpenEnv environment instead (OpenEnv's own server at the root of
the port, episodes in the same env workers; :mod:`progpo_envs.server.openenv_app`), for OpenEnv's
``GenericEnvClient`` and the trainers built on it (TRL, verifiers, SkyRL, ...)::

    progpo serve --protocol openenv --env progpo/ALFWorld-v0 --port 8010

A usage error (an unknown env id, a folder that does not exist, a port in use) is one line on stderr and exit
status 2; the port is bound before the env workers start, so a busy one is said within seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import socket
import sys
from collections.abc import Callable

from flask import Flask

from progpo_base.usage import CommandParser, UsageError, existing_dir, one_of, report
from progpo_envs.core.registration import env_creator, listed_splits
from progpo_envs.server.agentgym import AgentGymGames, Flavor, flavor_of
from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.policy import HOSTABLE_NAMESPACE, NEVER_HOSTED, PolicyError
from progpo_envs.server.pool import PoolConfig, WorkerStartError
from progpo_envs.server.serving import (
    DEFAULT_THREADS,
    listening_socket,
    make_wsgi_server,
    serve_until_stopped,
)
from webshop_server.clients import add_client_tokens_option, tokens_of_option

#: Envs whose AgentGym protocol is mounted automatically.
AGENTGYM_ENVS = ("progpo/ALFWorld-v0", "progpo/WebShop-v0")
#: The env hosted when no ``--env`` is given.
DEFAULT_ENV = "progpo/ALFWorld-v0"
#: The protocols ``--protocol`` chooses from: ours (with AgentGym's at the root) or OpenEnv's.
PROTOCOLS = ("native", "openenv")


def _id_value(text: str, what: str) -> tuple[str, str]:
    env_id, sep, value = text.partition("=")
    if not sep or not env_id:
        raise argparse.ArgumentTypeError(f"{what} must look like ENV_ID=VALUE, got {text!r}")
    return env_id, value


def _env_kwargs(text: str) -> tuple[str, dict]:
    env_id, value = _id_value(text, "--env-kwargs")
    try:
        kwargs = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--env-kwargs for {env_id}: invalid JSON ({exc})") from None
    if not isinstance(kwargs, dict):
        raise argparse.ArgumentTypeError(f"--env-kwargs for {env_id} must be a JSON object")
    return env_id, kwargs


def _allow_kwargs(text: str) -> tuple[str, tuple[str, ...]]:
    env_id, value = _id_value(text, "--allow-kwargs")
    return env_id, tuple(name for name in value.split(",") if name)


def build_parser() -> CommandParser:
    """The command line of ``progpo serve``."""
    parser = CommandParser(
        prog="progpo serve",
        description="Host registered progpo/* envs over HTTP: the env server's API and AgentGym's protocol, "
        "or one env as an OpenEnv environment (--protocol openenv).",
    )

    def per_env_option(flag: str, parse: Callable[[str], tuple], metavar: str, help: str) -> None:
        """A repeatable ``flag ENV_ID=VALUE``: a list of ``parse``'s ``(env_id, value)`` pairs."""
        parser.add_argument(flag, type=parse, action="append", default=[], metavar=metavar, help=help)

    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="native",
        help="native: the env server's API and AgentGym's; openenv: OpenEnv's server for one --env",
    )
    parser.add_argument(
        "--env",
        action="append",
        dest="envs",
        metavar="ENV_ID",
        help=f"env id to host (repeatable; default {DEFAULT_ENV})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    parser.add_argument(
        "--workers", type=int, default=1, help="env worker processes (instances spread over them)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="HTTP threads (openenv: threads that wait on the env workers for the sessions)",
    )
    parser.add_argument("--max-instances", type=int, default=1024, help="live instances at most (then 429)")
    parser.add_argument(
        "--max-instances-per-client",
        type=int,
        default=None,
        help="live instances one client (a host, or a client token) may hold (default: half of "
        "--max-instances; then 429)",
    )
    add_client_tokens_option(parser)
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="seconds before an idle instance expires (0: never, e.g. for AgentGym trainers that create "
        "their clients up front)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        help="seconds an env may take for one call before its worker is restarted",
    )
    per_env_option(
        "--env-kwargs", _env_kwargs, "ENV_ID=JSON", "constructor kwargs fixed by the operator (repeatable)"
    )
    per_env_option(
        "--allow-kwargs",
        _allow_kwargs,
        "ENV_ID=a,b",
        "kwargs clients may set (default: read from the env's constructor; empty: none)",
    )
    parser.add_argument(
        "--agentgym",
        default="auto",
        metavar="ENV_ID|auto|none",
        help="env served through AgentGym's protocol at the root (auto: the first --env if it is ALFWorld "
        "or WebShop)",
    )
    parser.add_argument(
        "--agentgym-mappings",
        metavar="DIR",
        help="folder with AgentGym's ALFWorld mappings_train.json and mappings_test.json: AgentGym's game "
        "ids then load AgentGym's games from the real data (default: ids index the hosted split)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register more progpo/* envs)",
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line of ``progpo serve`` (a usage error exits with status 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("workers", "threads", "max_instances", "max_instances_per_client"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.idle_timeout < 0:
        parser.error("--idle-timeout must be >= 0 (0: never expire)")
    if args.request_timeout <= 0:
        parser.error("--request-timeout must be > 0")
    return args


def hostable_env_ids() -> list[str]:
    """The registered env ids a server can host."""
    import gymnasium as gym

    import progpo_envs  # noqa: F401  (registers the ids)

    return sorted(i for i in gym.registry if i.startswith(HOSTABLE_NAMESPACE) and i not in NEVER_HOSTED)


def build_config(args: argparse.Namespace) -> ServerConfig:
    """The server configuration for parsed arguments (:class:`UsageError` for what cannot be served)."""
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--import {module}: {exc}") from None
    env_ids = tuple(dict.fromkeys(args.envs or [DEFAULT_ENV]))
    hostable = hostable_env_ids()
    for env_id in env_ids:
        if env_id not in hostable:
            raise one_of("env", env_id, hostable)
    if args.protocol == "openenv":
        if len(env_ids) != 1:
            raise UsageError("--protocol openenv serves one env per port: give exactly one --env")
        if args.agentgym not in ("auto", "none") or args.agentgym_mappings is not None:
            raise UsageError("--agentgym and --agentgym-mappings go with --protocol native")
        args.agentgym = "none"
    if args.agentgym == "none":
        agentgym = None
    elif args.agentgym == "auto":
        agentgym = env_ids[0] if env_ids[0] in AGENTGYM_ENVS else None
    else:
        agentgym = args.agentgym
        if agentgym not in env_ids:
            choices = ", ".join([*env_ids, "auto", "none"])
            raise UsageError(f"--agentgym {agentgym} is not a hosted env; choose from {choices}")
    mappings = None
    env_kwargs = dict(args.env_kwargs)
    if args.agentgym_mappings is not None:
        mappings = str(existing_dir("--agentgym-mappings", args.agentgym_mappings))
        if agentgym is None or flavor_of(agentgym) is not Flavor.ALFWORLD:
            raise UsageError("--agentgym-mappings needs an ALFWorld env served through AgentGym's protocol")
        try:
            games = AgentGymGames.for_env(mappings, env_kwargs.get(agentgym, {}))
        except (FileNotFoundError, ValueError) as exc:
            raise UsageError(f"--agentgym-mappings: {exc}") from None
        env_kwargs[agentgym] = _split_for_partial_data(agentgym, env_kwargs.get(agentgym, {}), games)
    for env_id in env_ids:
        _check_split(env_id, env_kwargs.get(env_id, {}))
    pool = PoolConfig(
        num_workers=args.workers,
        max_instances=args.max_instances,
        max_instances_per_client=args.max_instances_per_client,
        idle_timeout=args.idle_timeout or math.inf,  # 0: an instance never expires
        request_timeout=args.request_timeout,
    )
    return ServerConfig(
        env_ids=env_ids,
        env_kwargs=env_kwargs,
        allowed_kwargs=dict(args.allow_kwargs),
        pool=pool,
        agentgym=agentgym,
        agentgym_mappings=mappings,
        client_tokens=tokens_of_option(args.client_tokens),
    )


def _parameters(spec) -> dict:
    """The constructor parameters of a registered env (by name)."""
    import inspect

    return dict(inspect.signature(env_creator(spec.entry_point)).parameters)


def _check_split(env_id: str, kwargs: dict) -> None:
    """The split ``env_id`` will be built with (the operator's, else the constructor's default) must be one
    its data has: else one line naming the ones it has and how to choose one (before any worker starts)."""
    import gymnasium as gym

    from progpo_envs.alfworld.data import missing_data_dir, resolve_data_dir

    spec = gym.spec(env_id)
    fixed = {**(spec.kwargs or {}), **kwargs}
    splits = listed_splits(spec.entry_point, fixed)
    parameter = _parameters(spec).get("split")
    if splits is None or parameter is None:
        return
    reads_data = "data_dir" in _parameters(spec)
    missing = missing_data_dir(fixed.get("data_dir")) if not splits and reads_data else None
    if missing is not None:
        raise UsageError(f"{env_id}: {missing}")
    split = fixed.get("split", parameter.default)
    split = getattr(split, "value", split)  # an enum default (WebShop's Split.TRAIN)
    if str(split) not in splits:
        root = resolve_data_dir(fixed.get("data_dir")) if "data_dir" in _parameters(spec) else None
        where = f" in {root}/json_2.1.1" if root is not None else ""
        fix = (
            f"choose one with --env-kwargs '{env_id}={json.dumps({'split': splits[0]})}'"
            if splits
            else "give the folder that contains json_2.1.1/ (ALFWORLD_DATA or data_dir)"
        )
        has = ", ".join(splits) or "none"
        raise UsageError(f"{env_id}: no split {split!r}{where} (it has: {has}); {fix}")


def _split_for_partial_data(env_id: str, kwargs: dict, games: AgentGymGames) -> dict:
    """``kwargs`` for ``env_id`` with AgentGym's games: when the operator chose no split and the env's default
    one is not in the data (e.g. AgentGym's test trials only), the native API hosts AgentGym's default split,
    so the server starts (its workers build the env once at start) and absent ids answer 404 naming them."""
    import gymnasium as gym

    from progpo_envs.alfworld.data import available_splits

    if "split" in kwargs:
        return kwargs
    default = _parameters(gym.spec(env_id)).get("split")
    if default is None or default.default in available_splits(games.data_dir):
        return kwargs
    print(
        f"progpo serve: note: {games.data_dir}/json_2.1.1 has no split {default.default!r}; the native API "
        f"hosts {games.default_split!r} (choose another with --env-kwargs)",
        file=sys.stderr,
    )
    return {**kwargs, "split": games.default_split}


def app_from_environment() -> Flask:
    """An app configured by ``PROGPO_SERVE_ARGS`` (``progpo serve`` flags in one string), for gunicorn."""
    config = build_config(parse_args(shlex.split(os.environ.get("PROGPO_SERVE_ARGS", ""))))
    print(json.dumps({"serving": list(config.env_ids), "agentgym": config.agentgym}))
    return create_app(config)


def openenv_app_from_environment():
    """The OpenEnv app configured by ``PROGPO_SERVE_ARGS`` (``progpo serve`` flags in one string), for
    ``uvicorn --factory progpo_envs.server.cli:openenv_app_from_environment`` (the ``app`` of the
    ``openenv.yaml`` manifests)."""
    from progpo_envs.server.openenv_app import create_openenv_app

    args = parse_args([*shlex.split(os.environ.get("PROGPO_SERVE_ARGS", "")), "--protocol", "openenv"])
    config = build_config(args)
    print(json.dumps({"serving": list(config.env_ids), "protocol": "openenv"}), flush=True)
    return create_openenv_app(config, threads=args.threads)


def serve_openenv(args: argparse.Namespace, config: ServerConfig, sock: socket.socket) -> int:
    """``progpo serve --protocol openenv``: OpenEnv's server for one env on ``sock`` (bound already) until
    SIGTERM or SIGINT."""
    try:
        from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app, serve_until_stopped
    except ModuleNotFoundError as exc:
        return report(
            "progpo serve",
            UsageError(f"--protocol openenv needs the openenv extra (pip install '.[openenv]'): {exc}"),
        )
    try:
        app = create_openenv_app(config, threads=args.threads)
    except (UsageError, PolicyError) as error:
        return report("progpo serve", error)
    server = OpenEnvServer(app, host=args.host, sock=sock)
    print(
        json.dumps(
            {
                "serving": list(config.env_ids),
                "url": server.url,
                "protocol": "openenv",
                "workers": args.workers,
                "max_sessions": config.pool.max_instances,
            }
        ),
        flush=True,
    )
    serve_until_stopped(server)  # drains on SIGTERM, then stops the env workers
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the env server until interrupted."""
    args = parse_args(argv)
    try:
        config = build_config(args)
        sock = listening_socket(args.host, args.port)  # before the slow start: a busy port is said at once
    except (UsageError, PolicyError) as error:
        return report("progpo serve", error)
    with sock:
        if args.protocol == "openenv":
            return serve_openenv(args, config, sock)
        return serve_native(args, config, sock)


def serve_native(args: argparse.Namespace, config: ServerConfig, sock: socket.socket) -> int:
    """``progpo serve`` (``--protocol native``): the env server's API and AgentGym's on ``sock`` (bound
    already) until SIGTERM or SIGINT."""
    try:
        app = create_app(config)
    except (UsageError, PolicyError, WorkerStartError) as error:
        return report("progpo serve", error)
    server = make_wsgi_server(app, threads=args.threads, sock=sock)
    print(
        json.dumps(
            {
                "serving": list(config.env_ids),
                "url": f"http://{args.host}:{server.effective_port}",
                "workers": args.workers,
                "agentgym": config.agentgym,
            }
        ),
        flush=True,
    )
    serve_until_stopped(server, app.extensions["progpo_pool"])  # drains on SIGTERM and SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
