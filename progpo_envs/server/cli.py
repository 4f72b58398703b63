"""``progpo serve``: host registered envs over HTTP.

Example::

    progpo serve --env progpo/ALFWorld-v0 --port 8000 --workers 2 --max-instances 512 --idle-timeout 600 \\
        --env-kwargs 'progpo/ALFWorld-v0={"split": "valid_seen"}'

Then ``curl localhost:8000/ready`` and, from Python,
``gymnasium.make("progpo/Remote-v0", url="http://localhost:8000", env_id="progpo/ALFWorld-v0")``.
The AgentGym protocol (``/create``, ``/reset``, ``/step``, ...) is mounted at the root for the first ``--env``
when it is ALFWorld or WebShop (``--agentgym ENV_ID`` picks another, ``--agentgym none`` turns it off).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.serving import DEFAULT_THREADS, make_wsgi_server

#: Envs whose AgentGym protocol is mounted automatically.
AGENTGYM_ENVS = ("progpo/ALFWorld-v0", "progpo/WebShop-v0")


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of ``progpo serve``."""
    parser = argparse.ArgumentParser(
        prog="progpo serve", description="Host registered progpo/* envs over HTTP."
    )
    parser.add_argument(
        "--env",
        action="append",
        dest="envs",
        metavar="ENV_ID",
        help="env id to host (repeatable; default progpo/ALFWorld-v0)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers", type=int, default=1, help="env worker processes (instances spread over them)"
    )
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="HTTP threads")
    parser.add_argument("--max-instances", type=int, default=1024, help="live instances at most (then 429)")
    parser.add_argument(
        "--idle-timeout", type=float, default=600.0, help="seconds before an idle instance expires"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        help="seconds an env may take for one call before its worker is restarted",
    )
    parser.add_argument(
        "--env-kwargs",
        type=_env_kwargs,
        action="append",
        default=[],
        metavar="ENV_ID=JSON",
        help="constructor kwargs fixed by the operator (repeatable)",
    )
    parser.add_argument(
        "--allow-kwargs",
        type=_allow_kwargs,
        action="append",
        default=[],
        metavar="ENV_ID=a,b",
        help="kwargs clients may set (default: read from the env's constructor; empty: none)",
    )
    parser.add_argument(
        "--agentgym",
        default="auto",
        metavar="ENV_ID|auto|none",
        help="env served through AgentGym's protocol at the root",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register more progpo/* envs)",
    )
    args = parser.parse_args(argv)
    for name in ("workers", "threads", "max_instances"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.idle_timeout <= 0 or args.request_timeout <= 0:
        parser.error("--idle-timeout and --request-timeout must be > 0")
    return args


def build_config(args: argparse.Namespace) -> ServerConfig:
    """The server configuration for parsed arguments."""
    for module in args.imports:
        importlib.import_module(module)
    env_ids = tuple(dict.fromkeys(args.envs or ["progpo/ALFWorld-v0"]))
    if args.agentgym == "none":
        agentgym = None
    elif args.agentgym == "auto":
        agentgym = env_ids[0] if env_ids[0] in AGENTGYM_ENVS else None
    else:
        agentgym = args.agentgym
        if agentgym not in env_ids:
            raise SystemExit(
                f"progpo serve: --agentgym {agentgym} is not among the hosted envs {list(env_ids)}"
            )
    pool = PoolConfig(
        num_workers=args.workers,
        max_instances=args.max_instances,
        idle_timeout=args.idle_timeout,
        request_timeout=args.request_timeout,
    )
    return ServerConfig(
        env_ids=env_ids,
        env_kwargs=dict(args.env_kwargs),
        allowed_kwargs=dict(args.allow_kwargs),
        pool=pool,
        agentgym=agentgym,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the env server until interrupted."""
    args = parse_args(argv)
    config = build_config(args)
    app = create_app(config)
    server = make_wsgi_server(app, host=args.host, port=args.port, threads=args.threads)
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
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        app.extensions["progpo_pool"].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
