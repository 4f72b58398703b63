"""Search: sanitising agent text, finding goal products, caching and determinism."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webshop_server.catalog import load_catalog
from webshop_server.search import (
    MAX_QUERY_TERMS,
    SEARCH_RETURN_N,
    SearchIndex,
    product_search_text,
    query_terms,
    search_terms,
)

NASTY_QUERIES = [
    "",
    " ",
    '"',
    "'",
    "(",
    ")",
    "[",
    "]",
    "{}",
    "-",
    "+",
    "*",
    "AND",
    "OR",
    "NOT",
    "\\",
    "~2",
    "^3",
    ":",
    "/",
    "men's \"running shoes",
    "shoes AND",
    "-black sneakers",
    "title:(x",
    "8x10'",
    "a" * 10_000,
    "shoes " * 2000,
    "\x00\x01\x02",
    "\ud800 lone surrogate",
    "日本語 のテキスト",
    "café crème brûlée",
    "🙂🙃 emoji",
    "search[black shoes]",
    "click[buy now]",
    "null",
    "None",
    "\t\n\r",
]


def test_query_terms_sanitise():
    assert query_terms('Men\'s "Running (Shoes" -black AND') == [
        "men",
        "s",
        "running",
        "shoes",
        "black",
        "and",
    ]
    assert query_terms("") == [] and query_terms("!!! ??? ---") == []
    assert query_terms("x" * 39 + " " + "y" * 40) == ["x" * 39]  # tantivy drops tokens of 40+ bytes
    assert len(query_terms(" ".join(f"w{i}" for i in range(500)))) == MAX_QUERY_TERMS
    assert query_terms("a_b") == ["a", "b"]  # underscores split like tantivy's tokenizer
    assert query_terms(None) == ["none"] and query_terms(12) == ["12"]


def test_search_terms_drop_stopwords_and_stem():
    # Like Anserini's default analyzer: Lucene's English stop words out, English stemming.
    assert search_terms("The Running Shoes and the dresses") == ["run", "shoe", "dress"]
    assert search_terms("AND OR NOT the of a") == []
    assert search_terms("\ud800 café 日本語") == ["café", "日本語"]


def test_stemming_matches_word_forms(search_index, catalog):
    assert search_index.search("sneaker") == search_index.search("sneakers") != []
    assert search_index.search("the of and") == []


def test_nasty_queries_never_raise(search_index, catalog):
    known = set(catalog.product_by_asin)
    for query in NASTY_QUERIES:
        result = search_index.search(query)
        assert isinstance(result, list) and len(result) <= SEARCH_RETURN_N
        assert set(result) <= known
    assert search_index.search("") == [] and search_index.search("((((") == []
    assert search_index.search("shoes " * 2000) == search_index.search("shoes") != []
    assert len(search_index.search("black")) == SEARCH_RETURN_N


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.text(max_size=300),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=2000),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    ),
    st.integers(min_value=-5, max_value=120),
)
def test_arbitrary_text_never_raises(search_index, query, top_k):
    result = search_index.search(query, top_k=top_k)
    assert len(result) <= max(top_k, 0)
    assert len(set(result)) == len(result)


def test_goal_instruction_finds_target_in_top_50(search_index, catalog):
    goals = catalog.goals[:500]
    found = sum(goal["asin"] in search_index.search(goal["instruction_text"]) for goal in goals)
    assert found / len(goals) >= 0.9


def test_product_title_finds_itself_first_page(search_index, catalog):
    products = catalog.products[:300]
    first_page = sum(p["asin"] in search_index.search(p["Title"])[:10] for p in products)
    assert first_page / len(products) >= 0.9


def test_indexed_text_is_upstreams_recipe(catalog):
    product = next(p for p in catalog.products if len(p["options"]) == 2)
    text = product_search_text(product)
    assert text == text.lower()
    assert text.startswith(
        f"{product['Title']} {product['Description']} {product['BulletPoints'][0]}".lower()
    )
    (n1, v1), (n2, v2) = product["options"].items()
    assert text.endswith(f"{n1}: {', '.join(v1)}, and {n2}: {', '.join(v2)}")


def test_index_is_cached_by_fingerprint_and_deterministic(
    search_index, catalog, catalog_dir, cache_dir, tmp_path
):
    assert search_index.num_docs == len(catalog.products)
    assert search_index.path.name.startswith(catalog.fingerprint)
    stamp = os.stat(search_index.path).st_mtime_ns
    again = SearchIndex.open_or_build(catalog, cache_dir=cache_dir)
    assert again.path == search_index.path and os.stat(again.path).st_mtime_ns == stamp
    # An independent build gives the same rankings (single writer thread, fixed document order).
    fresh = SearchIndex.open_or_build(catalog, cache_dir=tmp_path)
    for goal in catalog.goals[:50]:
        assert fresh.search(goal["instruction_text"]) == search_index.search(goal["instruction_text"])
    # A different catalog (here: fewer products) gets its own index.
    smaller = load_catalog(catalog_dir, num_products=100)
    small_index = SearchIndex.open_or_build(smaller, cache_dir=cache_dir)
    assert small_index.path != search_index.path and small_index.num_docs == 100


def test_opening_writes_nothing(search_index):
    # Workers open the shared index read-only: opening and searching must not touch its directory.
    def snapshot():
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in search_index.path.iterdir()}

    before = snapshot()
    reopened = SearchIndex(search_index.path)
    reopened.search("black running shoes")
    assert snapshot() == before
