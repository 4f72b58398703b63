"""A tantivy BM25 index over the same per-product text upstream indexed with pyserini.

Upstream (``search_engine/convert_product_file_format.py``) indexes one document per product whose
``contents`` is the lowercased ``Title + Description + BulletPoints[0] + "name: v1, v2, and name2: ..."``, and
searches it with Anserini's default BM25 (k1=0.9, b=0.4), default English analyzer (Lucene's English stop
words removed, Porter stemming) and OR semantics, keeping the top 50 (``SEARCH_RETURN_N``), shown 10 per page
(``PRODUCT_WINDOW``). We index the same text with tantivy's BM25 (k1=1.2, b=0.75, fixed by the tantivy Python
binding) and an analyzer close to Anserini's (split on non-alphanumerics, drop tokens of 40+ bytes,
lowercase, remove Lucene's 33 English stop words, Snowball English stemming), and search with an OR of term
queries. Rankings are therefore close to, but not bit-identical with, upstream's.

Agent text never reaches tantivy's query parser (which raises on quotes, brackets, a leading ``-``...): it is
reduced to word tokens by ``query_terms`` and then to index terms by the same analyzer (``search_terms``), so
any string is a valid query.

The index lives in ``<cache>/index/<catalog fingerprint>-v<INDEX_VERSION>/``. It is built once into a
temporary directory with a single writer thread (a deterministic document order, hence deterministic tie
order) and renamed into place atomically, so concurrent workers never see a half-built index; afterwards every
worker only opens it for reading. A complete index in a folder this process cannot write (a read-only volume,
another user's cache) is opened through a private folder of links to its files: tantivy takes a lock file
beside the index even to read it, and the lock goes there instead (the index files are never written).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tantivy
from tqdm import tqdm

INDEX_VERSION = 2
SEARCH_RETURN_N = 50  # upstream: top 50 results
PRODUCT_WINDOW = 10  # upstream: 10 results per page
MAX_QUERY_TERMS = 64  # bound on distinct terms taken from one query (10 KB agent strings stay fast)
_MAX_TOKEN_BYTES = 40  # tantivy's default tokenizer drops tokens of >= 40 bytes (RemoveLongFilter)
_TOKEN = re.compile(r"[^\W_]+")
_COMPLETE_MARKER = "COMPLETE"
ANALYZER_NAME = "webshop_en"
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, which Anserini's default analyzer removes.
LUCENE_ENGLISH_STOPWORDS: tuple[str, ...] = tuple(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)
_WRITER_HEAP_BYTES = 128 << 20


def product_search_text(product: Mapping[str, Any]) -> str:
    """Upstream's indexed ``contents`` for a loaded product.

    Example:
        >>> product_search_text({"Title": "Acme Mug", "Description": "A mug.", "BulletPoints": ["Holds tea"],
        ...                      "options": {"color": ["red", "blue"], "size": ["s"]}})
        'acme mug a mug. holds tea color: red, blue, and size: s'
    """
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    bullets = product["BulletPoints"]
    first_bullet = bullets[0] if bullets else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text]).lower()


def query_terms(text: Any) -> list[str]:
    """The distinct index tokens of ``text`` in order of appearance (at most ``MAX_QUERY_TERMS``).

    Never raises: non-strings are converted with ``str``; punctuation, quotes and brackets separate tokens.

    Example:
        >>> query_terms('men\\'s "running (shoes" -black AND')
        ['men', 's', 'running', 'shoes', 'black', 'and']
    """
    if not isinstance(text, str):
        text = str(text)
    terms: dict[str, None] = {}
    for match in _TOKEN.finditer(text.lower()):
        token = match.group()
        if len(token.encode("utf-8", "surrogatepass")) < _MAX_TOKEN_BYTES:
            terms[token] = None
            if len(terms) >= MAX_QUERY_TERMS:
                break
    return list(terms)


@functools.lru_cache(maxsize=1)
def _analyzer() -> tantivy.TextAnalyzer:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(_MAX_TOKEN_BYTES))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(list(LUCENE_ENGLISH_STOPWORDS)))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def search_terms(text: Any) -> list[str]:
    """The distinct index terms a query searches for: ``query_terms``, then stop words out and stemming.

    Example:
        >>> search_terms("The Running Shoes for women, running!")
        ['run', 'shoe', 'women']
    """
    tokens = query_terms(text)
    if not tokens:
        return []
    # query_terms left only word characters and spaces, which the analyzer always accepts.
    return list(dict.fromkeys(_analyzer().analyze(" ".join(tokens))))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("asin", stored=True, tokenizer_name="raw")
    builder.add_text_field("contents", stored=False, tokenizer_name=ANALYZER_NAME, index_option="freq")
    return builder.build()


def _linked_copy(path: Path) -> Path:
    """A private writable folder of symbolic links to the files of the index at ``path`` (removed at exit):
    tantivy can take its lock there while it reads the files where they are."""
    view = Path(tempfile.mkdtemp(prefix="progpo-index-"))
    atexit.register(shutil.rmtree, view, True)
    for item in path.iterdir():
        if item.is_file() and not item.name.endswith(".lock"):
            (view / item.name).symlink_to(item.resolve())
    return view


def default_index_root() -> Path:
    """``<cache>/index`` under the catalog cache directory."""
    from webshop_server.catalog.loader import default_cache_dir

    return default_cache_dir() / "index"


class SearchIndexError(RuntimeError):
    """A cached search index that tantivy cannot read (a damaged file); the message says to delete it."""


class SearchIndex:
    """A read-only BM25 index over a catalog's products.

    Build or open one with ``SearchIndex.open_or_build(catalog)``; share it between sessions (searching is
    read-only and thread-safe).

    Example:
        >>> import tempfile
        >>> from webshop_server.catalog import default_catalog
        >>> cat = default_catalog(200, seed=0, cache_dir=tempfile.mkdtemp())
        >>> index = SearchIndex.open_or_build(cat, cache_dir=tempfile.mkdtemp())
        >>> goal = cat.goals[0]
        >>> goal["asin"] in index.search(goal["instruction_text"])
        True
        >>> index.search('"unbalanced (quote -'), index.search("")
        ([], [])
    """

    def __init__(self, path: str | os.PathLike[str]):
        """Open the index at ``path`` (a directory written by ``build``) for reading."""
        self.path = Path(path)
        if not (self.path / _COMPLETE_MARKER).is_file():
            raise FileNotFoundError(f"{self.path}: no complete search index here")
        where = self.path if os.access(self.path, os.W_OK) else _linked_copy(self.path)
        try:
            self._index = tantivy.Index(_schema(), str(where), reuse=True)
            self._index.register_tokenizer(ANALYZER_NAME, _analyzer())
            self._searcher = self._index.searcher()
        except ValueError as exc:  # tantivy reports a damaged file as a ValueError
            if "Lockfile" in str(exc) or "No space left" in str(exc):
                raise  # not the index's fault: the folder (failure_line says what to do)
            reason = " ".join(str(exc).split())[:200]
            raise SearchIndexError(
                f"the search index {self.path} is damaged ({reason}): delete {self.path} to have it built "
                "again"
            ) from None
        self._schema = self._index.schema

    @property
    def num_docs(self) -> int:
        """Number of indexed products."""
        return self._searcher.num_docs

    @property
    def searcher(self) -> tantivy.Searcher:
        """The tantivy searcher :meth:`search` queries (to measure the bare engine against it)."""
        return self._searcher

    @property
    def schema(self) -> tantivy.Schema:
        """The index's tantivy schema (one ``contents`` text field and the stored ``asin``)."""
        return self._schema

    @staticmethod
    def build(
        products: Iterable[Mapping[str, Any]], path: str | os.PathLike[str], *, progress: bool = False
    ) -> Path:
        """Index ``products`` into the (new or empty) directory ``path``; returns ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        index = tantivy.Index(_schema(), str(path), reuse=False)
        index.register_tokenizer(ANALYZER_NAME, _analyzer())
        # One writer thread: documents land in a fixed order, so ties rank the same in every build.
        writer = index.writer(_WRITER_HEAP_BYTES, 1)
        for product in tqdm(products, desc="index products", disable=not progress, unit="product"):
            writer.add_document(tantivy.Document(asin=product["asin"], contents=product_search_text(product)))
        writer.commit()
        writer.wait_merging_threads()
        (path / _COMPLETE_MARKER).write_text("ok\n")
        return path

    @classmethod
    def open_or_build(
        cls, catalog: Any, cache_dir: str | os.PathLike[str] | None = None, *, progress: bool | None = None
    ) -> SearchIndex:
        """Open the index cached for ``catalog`` (keyed by ``catalog.fingerprint``); build it if needed.

        Args:
            catalog: a ``webshop_server.catalog.Catalog`` (needs ``.products`` and ``.fingerprint``).
            cache_dir: the directory holding indexes (each in ``<fingerprint>-v<INDEX_VERSION>/``); default
                ``<PROGPO_CACHE or ~/.cache/progpo>/webshop/index``.
            progress: show a progress bar while building (default: for 10k+ products).
        """
        root = Path(cache_dir) if cache_dir is not None else default_index_root()
        # The index format version is part of the name: a stale index from older code is never opened.
        final = root / f"{catalog.fingerprint}-v{INDEX_VERSION}"
        if not (final / _COMPLETE_MARKER).is_file():
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{catalog.fingerprint}."))
            try:
                show = len(catalog.products) >= 10_000 if progress is None else progress
                cls.build(catalog.products, tmp, progress=show)
                try:
                    os.rename(tmp, final)
                except OSError:  # another worker won the race, or a stale incomplete directory is in the way
                    if not (final / _COMPLETE_MARKER).is_file():
                        shutil.rmtree(final, ignore_errors=True)
                        os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return cls(final)

    def search(self, query: Any, top_k: int = SEARCH_RETURN_N) -> list[str]:
        """Asins of the ``top_k`` best BM25 matches for ``query``, best first; ``[]`` when it has no terms.

        Any text is accepted (quotes, brackets, unicode, 10 KB strings): it is reduced by ``search_terms``.
        """
        terms = search_terms(query)
        if not terms or top_k <= 0:
            return []
        query_obj = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "contents", t)) for t in terms]
        )
        hits = self._searcher.search(query_obj, limit=int(top_k), count=False).hits
        return [self._searcher.doc(address)["asin"][0] for _, address in hits]
