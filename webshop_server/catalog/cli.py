"""``progpo webshop generate``: write a generated WebShop catalog (wired by ``webshop_server.cli``)."""

from __future__ import annotations

import time

from progpo_base.usage import CommandParser
from webshop_server.catalog.generator import generate_catalog


def generate_main(argv: list[str] | None = None) -> int:
    """Parse ``--out DIR --n N --seed S`` and write the three raw files into DIR.

    Example:
        >>> import tempfile
        >>> generate_main(["--out", tempfile.mkdtemp(), "--n", "20", "--seed", "1", "--quiet"])
        0
    """
    parser = CommandParser(
        prog="progpo webshop generate",
        description="Write a seeded synthetic WebShop catalog in WebShop's raw formats.",
    )
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--n", type=int, default=1000, help="number of products")
    parser.add_argument("--seed", type=int, default=0, help="catalog seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    start = time.perf_counter()
    out = generate_catalog(args.out, args.n, args.seed, progress=not args.quiet)
    if not args.quiet:
        print(f"wrote {args.n} products to {out} in {time.perf_counter() - start:.1f}s")
    return 0
