"""``progpo webshop``: serve the shop (site + session API) or generate a catalog.

* ``progpo webshop serve [--host 127.0.0.1] [--port 3000] [--num-products N] [--seed 0] [--data-dir DIR]
  [--server waitress|gunicorn] [--workers 8] [--max-sessions 10000] [--idle-timeout 1800] [--expose-expert]``
  — a production server:

  * ``waitress`` (default): one process, ``--workers`` threads, one catalog and index, sessions in memory;
  * ``gunicorn``: ``--workers`` processes forked after the catalog and index are loaded (copy-on-write), with
    the sessions in a shared SQLite file, so any worker serves any session and several cores work at once
    (:mod:`webshop_server.gunicorn_serving`).

  Either way each client host holds a share of the connections (and, with gunicorn, of the threads), and
  SIGTERM or SIGINT, to the process or its whole group, drains: the requests in flight finish first.
* ``progpo webshop generate --out DIR --n N --seed S`` — write WebShop's three raw files (the catalog
  generator).

Example:
    >>> from webshop_server.cli import build_parser
    >>> build_parser().parse_args(["serve", "--port", "3001"]).port
    3001
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from progpo_base.usage import CommandParser, UsageError, existing_dir, failure_line, report
from webshop_server.clients import add_client_tokens_option, tokens_of_option


def build_parser() -> CommandParser:
    """The ``progpo webshop`` argument parser."""
    parser = CommandParser(
        prog="progpo webshop",
        description="WebShop tools: serve the site and its session API, generate a catalog.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve the human site and the JSON session API",
        description="Serve the WebShop site and its JSON session API with a production server.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (loopback only)")
    serve.add_argument("--port", type=int, default=3000, help="port to listen on")
    serve.add_argument(
        "--num-products",
        type=int,
        default=None,
        help="generated catalog size (default 1000), or how many products to read from --data-dir (all)",
    )
    serve.add_argument("--seed", type=int, default=0, help="catalog generation seed")
    serve.add_argument(
        "--data-dir",
        default=os.environ.get("WEBSHOP_DATA"),
        help="folder of WebShop raw files to serve instead of the generated catalog (default: $WEBSHOP_DATA)",
    )
    serve.add_argument(
        "--synthetic-goals", action="store_true", help="use synthetic goals instead of human ones"
    )
    serve.add_argument(
        "--server",
        choices=["waitress", "gunicorn"],
        default="waitress",
        help="waitress: one process, --workers threads, sessions in memory; gunicorn: --workers processes "
        "forked after the catalog is loaded, sessions in a shared SQLite file",
    )
    serve.add_argument("--workers", type=int, default=8, help="threads (waitress) or processes (gunicorn)")
    serve.add_argument(
        "--max-sessions", type=int, default=10_000, help="live sessions at most (then new ones are refused)"
    )
    serve.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=None,
        help="live sessions one client (a host, or a client token) may hold (default: half of "
        "--max-sessions; behind a reverse proxy every client has the proxy's address: give clients tokens, "
        "or set it to --max-sessions there)",
    )
    add_client_tokens_option(serve)
    serve.add_argument(
        "--max-query-chars",
        type=int,
        default=4096,
        help="longest search query a session keeps (longer ones are refused with 400)",
    )
    serve.add_argument(
        "--idle-timeout", type=float, default=1800.0, help="seconds before an idle session expires"
    )
    serve.add_argument(
        "--expose-expert",
        action="store_true",
        help="serve the expert's next action (it reads the goal: tests and demos only)",
    )
    sub.add_parser(
        "generate", help="generate a catalog (see `progpo webshop generate --help`)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``progpo webshop``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "generate":
        from webshop_server.catalog import generate_main

        return int(generate_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    try:
        if args.workers < 1:
            raise UsageError("--workers must be >= 1")
        if args.max_sessions_per_client is not None and args.max_sessions_per_client < 1:
            raise UsageError("--max-sessions-per-client must be >= 1")
        if args.max_query_chars < 1:
            raise UsageError("--max-query-chars must be >= 1")
        existing_dir("--data-dir", args.data_dir)
        tokens = tokens_of_option(args.client_tokens)
    except UsageError as error:
        return report("progpo webshop serve", error)
    from webshop_server.app import ServerConfig, create_app
    from webshop_server.engine import WebShopEngine

    try:
        engine = WebShopEngine.shared(
            args.num_products, args.seed, data_dir=args.data_dir, human_goals=not args.synthetic_goals
        )
    except (OSError, ValueError, RuntimeError) as error:  # a full disk, a read-only or damaged cache
        return report("progpo webshop serve", UsageError(failure_line(error)))
    config = ServerConfig(
        max_sessions=args.max_sessions,
        max_sessions_per_client=args.max_sessions_per_client,
        max_query_chars=args.max_query_chars,
        idle_timeout_s=args.idle_timeout,
        expose_expert=args.expose_expert,
        client_tokens=tokens,
    )
    print(
        f"WebShop: {len(engine.catalog.products)} products, {engine.num_goals} goals; "
        f"http://{args.host}:{args.port}/ ({args.server}, {args.workers} workers)",
        flush=True,
    )
    if args.server == "waitress":
        from webshop_server.serving import make_server, serve_until_stopped

        server = make_server(
            create_app(engine, config), host=args.host, port=args.port, threads=args.workers, ident="webshop"
        )
        serve_until_stopped(server, name="webshop")  # drains on SIGTERM and SIGINT
        return 0
    from webshop_server import gunicorn_serving

    session_dir, master_pid = tempfile.mkdtemp(prefix="webshop-sessions-"), os.getpid()
    config.session_db = str(Path(session_dir) / "sessions.sqlite")
    try:
        gunicorn_serving.serve(create_app(engine, config), f"{args.host}:{args.port}", args.workers)
    finally:
        if os.getpid() == master_pid:  # forked workers exit through here too: only the master cleans up
            shutil.rmtree(session_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
