"""WebShop product catalog: a seeded generator of WebShop's raw files, and their loader.

Public API (stable; the page engine, server, env and expert code against it)::

    from webshop_server.catalog import (
        generate_catalog,  # (out_dir, num_products, seed=0, *, progress=False) -> Path: the three raw files
        generate_main,  # (argv) -> int: body of `progpo webshop generate --out DIR --n N --seed S`
        load_catalog,  # (data_dir, num_products=None, *, human_goals=True, seed=0, small=None) -> Catalog
        default_catalog,  # (num_products=None, seed=0, *, data_dir=None, human_goals=True, cache_dir=None)
        #   -> Catalog: real data from data_dir or $WEBSHOP_DATA (all products unless num_products),
        #   else a generated catalog of num_products (default 1000) cached on first use
        generated_catalog_dir,  # (num_products, seed, cache_dir=None) -> Path of cached generated files
        default_cache_dir,  # () -> $PROGPO_CACHE/webshop or ~/.cache/progpo/webshop
        Catalog,  # .products, .product_by_asin, .product_prices, .goals, .fingerprint, ...
        CatalogFormatError,  # ValueError naming the file, the record and the field that is wrong
        CatalogMissingError,  # CatalogFormatError: the folder or one of its files is not there
        DATA_FILES,  # the three raw file names
    )

Related: ``webshop_server.search.SearchIndex.open_or_build(catalog).search(text, top_k=50) -> list[asin]``
and ``webshop_server.reward.get_reward(product, goal, price, options, verbose=False)`` with
``product = catalog.product_by_asin[asin]``, ``price = catalog.product_prices[asin]`` and ``options`` the
{name: value} dict the agent chose (names and values as in ``product["options"]``).

Data files (WebShop's own raw formats, see ``docs/webshop.md`` §1.4 "Data schemas"):

* ``items_shuffle.json``: a JSON list of raw product dicts (``asin``, ``name``, ``full_description``,
  ``small_description``, ``pricing``, ``customization_options``, ``images``, ``product_category``,
  ``category``, ``query``, ...). The loader also accepts upstream's small-set ``items_shuffle_1000.json``.
* ``items_ins_v2.json``: a dict asin -> ``{"attributes": [...]}`` plus, for some products, ``instruction``
  and ``instruction_attributes`` (synthetic goals). Small-set name ``items_ins_v2_1000.json``.
* ``items_human_ins.json``: a dict asin -> list of human annotations (``instruction``,
  ``instruction_attributes``, ``instruction_options``, ``options``, ...). These make the standard goals.

Processed products (``Catalog.products``) keep the raw fields and add those upstream's
``web_agent_site/engine/engine.py::load_products`` adds: ``Title``, ``Description``, ``BulletPoints`` (list),
``Reviews`` ([]), ``Rating`` ("N.A."), ``pricing`` (list of floats), ``Price`` (tag string), ``options``
({lowercased name: [lowercased values, "/" -> " | "]}), ``option_to_image``, ``Attributes``, ``MainImage``
and a lowercased ``query``; plus ``instruction_text`` and ``instruction_attributes`` when loading synthetic
goals. The keys upstream cleans (``brand``, ``seller_id``, ...) are dropped as upstream does. Unlike upstream,
to save memory, the raw ``customization_options`` is dropped too (``options`` and ``option_to_image`` carry
all of it), and so are the raw human annotations (``instructions``) once the goals are built from them.

Goals (``Catalog.goals``) have upstream's fields: ``asin``, ``category``, ``query``, ``name``,
``product_category``, ``instruction_text``, ``attributes``, ``price_upper``, ``goal_options`` (a list of
values for human goals, a dict name -> value for synthetic goals) and ``weight``. They are shuffled with seed
233 like upstream; unlike upstream, every draw (range prices, price bounds) derives from ``seed``, so every
process sees the same goals.

Example:
    >>> import tempfile
    >>> from webshop_server.catalog import generate_catalog, load_catalog
    >>> out = generate_catalog(tempfile.mkdtemp(), num_products=200, seed=0)
    >>> cat = load_catalog(out)
    >>> len(cat.products), cat.goals[0]["asin"] in cat.product_by_asin
    (200, True)
"""

from webshop_server.catalog.cli import generate_main
from webshop_server.catalog.generator import GENERATOR_VERSION, generate_catalog
from webshop_server.catalog.loader import (
    DATA_FILES,
    Catalog,
    CatalogFormatError,
    CatalogMissingError,
    default_cache_dir,
    default_catalog,
    generated_catalog_dir,
    load_catalog,
)

__all__ = [
    "DATA_FILES",
    "GENERATOR_VERSION",
    "Catalog",
    "CatalogFormatError",
    "CatalogMissingError",
    "default_cache_dir",
    "default_catalog",
    "generate_catalog",
    "generate_main",
    "generated_catalog_dir",
    "load_catalog",
]
