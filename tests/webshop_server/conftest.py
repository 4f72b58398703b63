"""Fixtures of the WebShop site's tests: the engine's and the servers' (from
:mod:`tests.webshop_server.shop_fixtures`), and, for the data tests, one generated 1k catalog and its index
per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.webshop_server.shop_fixtures import generated_engine, http_server, tiny_engine  # noqa: E402,F401
from webshop_server.catalog import Catalog, generated_catalog_dir, load_catalog  # noqa: E402
from webshop_server.reward import set_noun_extractor  # noqa: E402
from webshop_server.search import SearchIndex  # noqa: E402

CATALOG_SIZE = 1000
CATALOG_SEED = 0


@pytest.fixture(scope="session", autouse=True)
def _heuristic_nouns():
    # Reward numbers in these tests are for the built-in noun heuristic, whatever is installed (the default
    # without spaCy, which the setup does not install).
    set_noun_extractor("heuristic")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> os.PathLike[str]:
    return tmp_path_factory.mktemp("webshop-cache")


@pytest.fixture(scope="session")
def catalog_dir(cache_dir):
    return generated_catalog_dir(CATALOG_SIZE, CATALOG_SEED, cache_dir)


@pytest.fixture(scope="session")
def catalog(catalog_dir) -> Catalog:
    return load_catalog(catalog_dir, seed=CATALOG_SEED)


@pytest.fixture(scope="session")
def synthetic_catalog(catalog_dir) -> Catalog:
    return load_catalog(catalog_dir, human_goals=False, seed=CATALOG_SEED)


@pytest.fixture(scope="session")
def search_index(catalog, cache_dir) -> SearchIndex:
    return SearchIndex.open_or_build(catalog, cache_dir=cache_dir)
