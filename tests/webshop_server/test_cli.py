"""``progpo webshop``: argument parsing and the generate subcommand (serve runs in test_http's fixture)."""

from __future__ import annotations

import json

import pytest

from webshop_server.cli import build_parser, main


def test_serve_arguments():
    args = build_parser().parse_args(["serve", "--port", "3100", "--workers", "2", "--expose-expert"])
    assert (args.port, args.workers, args.expose_expert, args.host) == (3100, 2, True, "127.0.0.1")
    assert args.num_products is None and args.max_sessions == 10_000
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--port", "many"])


def test_generate_writes_the_raw_files(tmp_path):
    assert main(["generate", "--out", str(tmp_path), "--n", "30", "--seed", "3", "--quiet"]) == 0
    products = json.loads((tmp_path / "items_shuffle.json").read_text())
    assert len(products) == 30 and (tmp_path / "items_human_ins.json").is_file()
