"""The WebShop tests' shared fixtures and tiny catalog (a module of its own: the conftests of
``tests/webshop_server`` and ``tests/progpo_envs/webshop`` import the fixtures they use from here, and the
tests import the helpers, never a conftest).

``tiny_engine`` runs the page engine over a hand-written six-product catalog and a word-overlap search, so the
engine, env and server tests do not depend on the catalog generator or the tantivy index. ``generated_engine``
uses the real generated catalog and index (the data helper's ``default_catalog`` + ``SearchIndex``) for the
tests that need many goals (the expert on 200 goals).
"""

from __future__ import annotations

import os
import re
import types

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from webshop_server.engine import WebShopEngine  # noqa: E402


def _product(asin, title, price, options, attributes, category="fashion › men › socks", query="men's socks"):
    return {
        "asin": asin,
        "name": title,
        "Title": title,
        "query": query,
        "category": "fashion",
        "product_category": category,
        "Description": f"{title}. A fine product made for everyday use.",
        "BulletPoints": [f"{a} for comfort" for a in attributes] or ["plain"],
        "Reviews": [],
        "Rating": "N.A.",
        "pricing": [price],
        "Price": f"${price:.2f}",
        "options": options,
        "Attributes": attributes,
    }


PRODUCTS = [
    _product(
        "B0SOCK0001",
        "Soft Cotton Crew Socks for Men",
        12.99,
        {"color": ["black", "white", "navy"], "size": ["small", "medium", "large"]},
        ["machine wash", "cotton"],
    ),
    _product(
        "B0SOCK0002",
        "Wool Hiking Socks for Men",
        19.50,
        {"color": ["grey", "green"], "size": ["medium", "large"]},
        ["wool", "moisture wicking"],
    ),
    _product("B0SOCK0003", "Bamboo Ankle Socks", 9.99, {}, ["bamboo", "breathable"]),
    _product(
        "B0TEA00001",
        "Organic Green Tea Bags",
        6.49,
        {"flavor name": ["jasmine", "mint", "lemon"]},
        ["organic", "caffeine"],
        category="grocery › beverages › tea",
        query="green tea",
    ),
    _product(
        "B0TEA00002",
        "Black Tea Loose Leaf",
        8.00,
        {"size": ["4 ounce", "16 ounce"]},
        ["loose leaf"],
        category="grocery › beverages › tea",
        query="black tea",
    ),
    _product(
        "B0LAMP0001",
        "LED Desk Lamp with USB Port",
        29.99,
        {"color": ["white", "black"]},
        ["dimmable", "usb port"],
        category="home › lighting › desk lamps",
        query="desk lamp",
    ),
]


def _goal(product, instruction, attributes, options, price_upper, category="fashion"):
    """A human goal of buying ``product`` (its asin, name, category and search query are the product's)."""
    return {
        "asin": product["asin"],
        "instruction_text": instruction,
        "attributes": attributes,
        "goal_options": options,
        "price_upper": price_upper,
        "query": product["query"],
        "category": category,
        "name": product["Title"],
        "product_category": product["product_category"],
        "weight": 1,
    }


GOALS = [
    _goal(
        PRODUCTS[0],
        "i need cotton crew socks for men, navy, large, machine wash, and price lower than 20.00 dollars",
        ["machine wash"],
        ["navy", "large"],
        20.0,
    ),
    _goal(
        PRODUCTS[3],
        "find organic green tea bags with mint flavor, and price lower than 10.00 dollars",
        ["organic"],
        ["mint"],
        10.0,
        category="grocery",
    ),
    _goal(
        PRODUCTS[5],
        "i want a dimmable desk lamp with a usb port in white",
        ["dimmable"],
        ["white"],
        40.0,
        category="home",
    ),
    _goal(PRODUCTS[2], "breathable bamboo ankle socks", ["bamboo"], [], 15.0),
]


class WordOverlapIndex:
    """A deterministic stand-in for the BM25 index: rank by shared words, then by catalog order."""

    def __init__(self, products):
        self.docs = [
            (p["asin"], set(re.findall(r"[a-z0-9]+", (p["Title"] + " " + p["Description"]).lower())))
            for p in products
        ]

    def search(self, query, top_k=50):
        words = set(re.findall(r"[a-z0-9]+", str(query).lower()))
        scored = [(-len(words & doc), i, asin) for i, (asin, doc) in enumerate(self.docs) if words & doc]
        return [asin for _, _, asin in sorted(scored)[:top_k]]


def make_tiny_catalog():
    return types.SimpleNamespace(
        products=PRODUCTS,
        product_by_asin={p["asin"]: p for p in PRODUCTS},
        product_prices={p["asin"]: p["pricing"][0] for p in PRODUCTS},
        goals=GOALS,
        fingerprint="tiny0001",
    )


def make_tiny_engine():
    catalog = make_tiny_catalog()
    return WebShopEngine(catalog, WordOverlapIndex(catalog.products))


@pytest.fixture
def tiny_engine():
    return make_tiny_engine()


@pytest.fixture(scope="session")
def generated_engine(tmp_path_factory):
    """The real stack: a generated 1000-product catalog, its tantivy index and the real reward."""
    pytest.importorskip("tantivy")
    from webshop_server.catalog import default_catalog
    from webshop_server.search import SearchIndex

    cache = tmp_path_factory.mktemp("webshop-cache")
    catalog = default_catalog(1000, 0, cache_dir=cache)
    index = SearchIndex.open_or_build(catalog, cache / "index")
    return WebShopEngine(catalog, index)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_server(tmp_path_factory, server: str, workers: int):
    import subprocess
    import sys
    import time

    import requests

    port = free_port()
    env = dict(os.environ, PROGPO_CACHE=str(tmp_path_factory.mktemp("server-cache")), OMP_NUM_THREADS="1")
    log = tmp_path_factory.mktemp("server-log") / "server.log"
    command = [
        sys.executable,
        "-m",
        "webshop_server.cli",
        "serve",
        "--port",
        str(port),
        "--num-products",
        "200",
        "--server",
        server,
        "--workers",
        str(workers),
        "--expose-expert",
        "--max-sessions",
        "500",
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(url + "/api/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield url, 200
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session", params=["waitress", "gunicorn"])
def http_server(request, tmp_path_factory):
    """``progpo webshop serve`` in a subprocess on a free loopback port: waitress (4 threads) or gunicorn (2
    processes sharing sessions through SQLite), over a generated 200-product catalog with the expert endpoint
    on. Yields ``(base_url, num_products)``."""
    workers = 4 if request.param == "waitress" else 2
    yield from _run_server(tmp_path_factory, request.param, workers)


@pytest.fixture(scope="session")
def waitress_server(tmp_path_factory):
    """The waitress server alone (for the browser test)."""
    yield from _run_server(tmp_path_factory, "waitress", 4)
