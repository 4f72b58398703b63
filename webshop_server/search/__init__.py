"""BM25 product search over a catalog, with tantivy (``docs/webshop.md`` §1.5, §4).

Public API::

    from webshop_server.search import SearchIndex, SEARCH_RETURN_N, PRODUCT_WINDOW
    from webshop_server.search import product_search_text, query_terms, search_terms

    index = SearchIndex.open_or_build(catalog)      # cached on disk, keyed by catalog.fingerprint
    asins = index.search("men's running shoes, black", top_k=50)   # best first, never raises
"""

from webshop_server.search.index import (
    INDEX_VERSION,
    MAX_QUERY_TERMS,
    PRODUCT_WINDOW,
    SEARCH_RETURN_N,
    SearchIndex,
    product_search_text,
    query_terms,
    search_terms,
)

__all__ = [
    "INDEX_VERSION",
    "MAX_QUERY_TERMS",
    "PRODUCT_WINDOW",
    "SEARCH_RETURN_N",
    "SearchIndex",
    "product_search_text",
    "query_terms",
    "search_terms",
]
