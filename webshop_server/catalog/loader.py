"""Load WebShop's raw catalog files (real or generated) into products, prices and goals.

Processing follows upstream's ``web_agent_site/engine/engine.py::load_products`` (``docs/webshop.md``
§1.4 "Data schemas"); goals follow ``goal.py`` (see ``webshop_server.goals``). Differences, all for
determinism or robustness:

* a price *range* gets a price drawn from xxh3-64 of ``(seed, asin)`` instead of the unseeded
  ``random.uniform``;
* every record is validated; a bad one raises ``CatalogFormatError`` naming the file, the record and the
  field;
* ``items_shuffle.json`` is parsed as a stream (one product at a time, never the whole text at once), so the
  5 GB full file is read once and held only as processed products;
* nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import xxhash

from webshop_server.catalog.generator import (
    ATTRS_FILE,
    GENERATOR_VERSION,
    HUMAN_INS_FILE,
    ITEMS_FILE,
    generate_catalog,
)
from webshop_server.goals import build_goals
from webshop_server.seeding import text_seed

DATA_FILES: tuple[str, str, str] = (ITEMS_FILE, ATTRS_FILE, HUMAN_INS_FILE)
# Upstream's small-set names (web_agent_site/utils.py, DEFAULT_FILE_PATH / DEFAULT_ATTR_PATH for 1000).
SMALL_FILES: dict[str, str] = {ITEMS_FILE: "items_shuffle_1000.json", ATTRS_FILE: "items_ins_v2_1000.json"}
DATA_ENV_VAR = "WEBSHOP_DATA"
CACHE_ENV_VAR = "PROGPO_CACHE"
DEFAULT_PRICE = 100.0  # upstream: an empty ``pricing`` means $100
FINGERPRINT_VERSION = 1

# Keys upstream's clean_product_keys drops from every product.
_CLEANED_KEYS = (
    "product_information",
    "brand",
    "brand_url",
    "list_price",
    "availability_quantity",
    "availability_status",
    "total_reviews",
    "total_answered_questions",
    "seller_id",
    "seller_name",
    "fulfilled_by_amazon",
    "fast_track_message",
    "aplus_present",
    "small_description_old",
)
_INTERNED_VALUES = ("category", "product_category", "query")
_NOT_PRICE_CHARS = re.compile(r"[^\d.]")
_MAX_RECORD_CHARS = 64 << 20  # a single product larger than this is certainly a malformed file


class CatalogFormatError(ValueError):
    """A catalog file is missing or malformed; the message names the file, the record and the field."""


class CatalogMissingError(CatalogFormatError):
    """The catalog folder, or one of its files, is not there (as opposed to there and malformed)."""


@dataclass
class Catalog:
    """A loaded catalog: processed products, their prices and the goals over them.

    Attributes:
        data_dir: the directory the three files were read from.
        products: processed products in file order (upstream's field names; see the package docstring).
        product_by_asin: asin -> processed product (the same dict objects as in ``products``).
        product_prices: asin -> the price the product sells at (a range gets a seeded draw inside it).
        goals: goals, shuffled with seed 233 like upstream; the RL splits index this list.
        attribute_to_asins: attribute phrase -> asins having it (upstream's ``attribute_to_asins``).
        human_goals: whether ``goals`` are human (True, the standard) or synthetic.
        seed: the seed of the price draws and goal price bounds.
        fingerprint: xxh3-64 hex of the loaded content and loading options; keys the search index cache.
    """

    data_dir: Path
    products: list[dict[str, Any]]
    product_by_asin: dict[str, dict[str, Any]]
    product_prices: dict[str, float]
    goals: list[dict[str, Any]]
    attribute_to_asins: dict[str, set[str]] = field(repr=False)
    human_goals: bool
    seed: int
    fingerprint: str

    def __repr__(self) -> str:
        return (
            f"Catalog(data_dir={str(self.data_dir)!r}, products={len(self.products)}, "
            f"goals={len(self.goals)}, "
            f"human_goals={self.human_goals}, seed={self.seed}, fingerprint={self.fingerprint!r})"
        )


def _fail(file: Path | str, where: str, message: str) -> CatalogFormatError:
    return CatalogFormatError(f"{Path(file).name}: {where}: {message}")


def iter_json_list(path: Path, chunk_chars: int = 1 << 20) -> Iterator[tuple[Any, str]]:
    """Stream the elements of a top-level JSON list: yields ``(element, its raw JSON text)``.

    Reads ``chunk_chars`` characters at a time and decodes one element at a time with
    ``json.JSONDecoder.raw_decode``; memory stays at about one chunk plus one element.

    Raises:
        CatalogFormatError: the file is not a JSON list or is malformed/truncated (names the element index).
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof, index = "", 0, False, 0

        def fill() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            chunk = f.read(chunk_chars)
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0
            return bool(chunk)

        def next_char() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not fill():
                    return ""

        if next_char() != "[":
            raise _fail(path, "top level", "expected a JSON list of products")
        pos += 1
        if next_char() == "]":
            return
        while True:
            next_char()  # raw_decode does not skip leading whitespace
            while True:
                try:
                    element, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as err:
                    if len(buf) - pos > _MAX_RECORD_CHARS or not fill():
                        raise _fail(path, f"element #{index}", f"invalid JSON ({err.msg})") from None
            raw, pos = buf[pos:end], end
            yield element, raw
            index += 1
            sep = next_char()
            if sep == "]":
                return
            if sep != ",":
                raise _fail(
                    path,
                    f"after element #{index - 1}",
                    "expected ',' or ']'" + (" but the file ended" if not sep else f", found {sep!r}"),
                )
            pos += 1


def _require(record: dict[str, Any], key: str, kinds: type | tuple[type, ...], file: Path, where: str) -> Any:
    if key not in record:
        raise _fail(file, where, f"missing field {key!r}")
    value = record[key]
    if not isinstance(value, kinds):
        names = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise _fail(file, where, f"field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _parse_pricing(pricing: Any, file: Path, where: str) -> tuple[list[float], str]:
    # Upstream: split on "$", strip everything but digits and ".", Decimal -> float; "" or None means $100.
    if pricing is None or pricing == "":
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if not isinstance(pricing, str):
        raise _fail(
            file, where, f"field 'pricing' must be a string like '$12.99' or '$5 - $9', got {pricing!r}"
        )
    try:
        values = [float(Decimal(_NOT_PRICE_CHARS.sub("", part))) for part in pricing.split("$")[1:]]
    except InvalidOperation:
        raise _fail(file, where, f"field 'pricing' is not a price: {pricing!r}") from None
    if not values:
        raise _fail(file, where, f"field 'pricing' has no '$' amount: {pricing!r}")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _parse_options(raw: Any, file: Path, where: str) -> tuple[dict[str, list[str]], dict[str, Any]]:
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    if not raw:
        return options, option_to_image
    if not isinstance(raw, dict):
        raise _fail(
            file, where, "field 'customization_options' must be '' or an object name -> list of values"
        )
    for name, contents in raw.items():
        if contents is None:
            continue
        if not isinstance(contents, list):
            raise _fail(file, where, f"customization_options[{name!r}] must be a list or null")
        values = []
        for content in contents:
            if not isinstance(content, dict) or not isinstance(content.get("value"), str):
                raise _fail(file, where, f"customization_options[{name!r}] entries need a string 'value'")
            value = sys.intern(content["value"].strip().replace("/", " | ").lower())
            values.append(value)
            option_to_image[value] = content.get("image")
        options[sys.intern(name.lower())] = values
    return options, option_to_image


def _price_draw(pricing: list[float], asin: str, seed: int) -> float:
    # Upstream generate_product_prices: a single price as is, a range uniform(lo, hi) (unseeded there).
    if len(pricing) == 1:
        return pricing[0]
    rng = random.Random(text_seed(f"price:{seed}:{asin}"))
    return round(rng.uniform(pricing[0], pricing[1]), 2)


def _load_json(path: Path, hasher: xxhash.xxh3_64) -> Any:
    data = path.read_bytes()
    hasher.update(data)
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _fail(path, "whole file", f"invalid JSON ({err})") from None


def _check_string_list(value: Any, file: Path, where: str, key: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(file, where, f"field {key!r} must be a list of strings")


def _validate_attrs(attrs: Any, file: Path) -> None:
    if not isinstance(attrs, dict):
        raise _fail(file, "top level", "expected an object asin -> {'attributes': [...], ...}")
    for asin, entry in attrs.items():
        where = f"asin {asin!r}"
        if not isinstance(entry, dict):
            raise _fail(file, where, "entry must be an object")
        if "attributes" in entry:
            _check_string_list(entry["attributes"], file, where, "attributes")
        if entry.get("instruction") is not None:
            if not isinstance(entry["instruction"], str):
                raise _fail(file, where, "field 'instruction' must be a string")
            _check_string_list(entry.get("instruction_attributes"), file, where, "instruction_attributes")


def _validate_human(human: Any, file: Path) -> None:
    if not isinstance(human, dict):
        raise _fail(file, "top level", "expected an object asin -> list of annotations")
    for asin, entries in human.items():
        if not isinstance(entries, list):
            raise _fail(file, f"asin {asin!r}", "value must be a list of annotations")
        for k, a in enumerate(entries):
            where = f"asin {asin!r} annotation #{k}"
            if not isinstance(a, dict):
                raise _fail(file, where, "annotation must be an object")
            _require(a, "instruction", str, file, where)
            _check_string_list(a.get("instruction_attributes"), file, where, "instruction_attributes")
            _check_string_list(a.get("instruction_options"), file, where, "instruction_options")


def _resolve(data_dir: Path, name: str, small: bool | None) -> Path:
    small_name = SMALL_FILES.get(name)
    candidates = (
        [name] if small is False or small_name is None else [small_name] if small else [name, small_name]
    )
    for candidate in candidates:
        if (data_dir / candidate).is_file():
            return data_dir / candidate
    raise CatalogMissingError(
        f"{data_dir}: missing {' or '.join(candidates)}. Point --data-dir / {DATA_ENV_VAR} at a directory "
        "holding "
        f"WebShop's {', '.join(DATA_FILES)} (nothing is downloaded), or generate one with "
        "`progpo webshop generate --out DIR`."
    )


def _process_product(p: dict[str, Any], file: Path, index: int) -> dict[str, Any]:
    where = f"product #{index} (asin {p.get('asin')!r})"
    for key in ("name", "full_description", "product_category", "category", "query"):
        _require(p, key, str, file, where)
    bullets = _require(p, "small_description", (list, str), file, where)
    if isinstance(bullets, list) and not all(isinstance(b, str) for b in bullets):
        raise _fail(file, where, "field 'small_description' must be a string or a list of strings")
    images = _require(p, "images", list, file, where)
    if not images:
        raise _fail(file, where, "field 'images' must be a non-empty list (upstream uses images[0])")
    if "customization_options" not in p:
        raise _fail(file, where, "missing field 'customization_options'")
    pricing, price_tag = _parse_pricing(p.get("pricing"), file, where)
    options, option_to_image = _parse_options(p["customization_options"], file, where)

    # Keys and the short strings every product repeats are interned: the stream decoder makes fresh copies per
    # product, which would cost ~2 KB per product (200 MB at 100k). The raw ``customization_options`` is not
    # kept: ``options`` and ``option_to_image`` hold all of it, and they are what upstream's pages read.
    product = {
        sys.intern(k): v for k, v in p.items() if k not in _CLEANED_KEYS and k != "customization_options"
    }
    for key in _INTERNED_VALUES:
        if isinstance(product.get(key), str):
            product[key] = sys.intern(product[key])
    product.update(
        {
            "Title": p["name"],
            "Description": p["full_description"],
            "Reviews": [],  # upstream's review loading is commented out: every product shows no reviews
            "Rating": "N.A.",
            "BulletPoints": bullets if isinstance(bullets, list) else [bullets],
            "pricing": pricing,
            "Price": price_tag,
            "options": options,
            "option_to_image": option_to_image,
            "MainImage": sys.intern(images[0]) if isinstance(images[0], str) else images[0],
            "query": sys.intern(p["query"].lower().strip()),
        }
    )
    return product


def load_catalog(
    data_dir: str | os.PathLike[str],
    num_products: int | None = None,
    *,
    human_goals: bool = True,
    seed: int = 0,
    small: bool | None = None,
) -> Catalog:
    """Read and validate WebShop's three raw files from ``data_dir``; process products; build goals.

    Args:
        data_dir: a directory with ``items_shuffle.json``, ``items_ins_v2.json`` and ``items_human_ins.json``
            (a real WebShop ``data/`` directory or a generated one).
        num_products: keep only the first n products of ``items_shuffle.json`` (upstream's ``num_products``);
            the rest of the file is not read. None keeps all.
        human_goals: build goals from the human annotations (the standard) or the synthetic instructions.
        seed: seeds the price draws for price ranges and the goals' price bounds.
        small: use upstream's ``*_1000.json`` names (True), the full names (False) or whichever exists
            (None, full first).

    Raises:
        CatalogFormatError: a file is missing or a record is malformed (the message names file, record,
        field).

    Example:
        >>> import tempfile
        >>> from webshop_server.catalog import generate_catalog
        >>> cat = load_catalog(generate_catalog(tempfile.mkdtemp(), 100, seed=1), num_products=50)
        >>> len(cat.products), all(g["asin"] in cat.product_by_asin for g in cat.goals)
        (50, True)
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CatalogMissingError(
            f"{data_dir}: not a directory (set --data-dir / {DATA_ENV_VAR} to WebShop's data)"
        )
    if num_products is not None and num_products < 1:
        raise ValueError(f"num_products must be >= 1 or None, got {num_products}")
    items_path = _resolve(data_dir, ITEMS_FILE, small)
    attrs_path = _resolve(data_dir, ATTRS_FILE, small)
    human_path = _resolve(data_dir, HUMAN_INS_FILE, small) if human_goals else None

    hasher = xxhash.xxh3_64()
    hasher.update(f"catalog-v{FINGERPRINT_VERSION}:{num_products}:{human_goals}:{seed}\n".encode())
    attributes = _load_json(attrs_path, hasher)
    _validate_attrs(attributes, attrs_path)
    human: dict[str, Any] = {}
    if human_path is not None:
        human = _load_json(human_path, hasher)
        _validate_human(human, human_path)

    products: list[dict[str, Any]] = []
    product_by_asin: dict[str, dict[str, Any]] = {}
    for index, (raw, text) in enumerate(iter_json_list(items_path)):
        if num_products is not None and index >= num_products:
            break
        if not isinstance(raw, dict):
            raise _fail(items_path, f"product #{index}", "must be an object")
        asin = _require(raw, "asin", str, items_path, f"product #{index}")
        # Upstream: skip 'nan' and over-long asins, and duplicates (first one wins).
        if asin == "nan" or len(asin) > 10 or asin in product_by_asin:
            continue
        hasher.update(text.encode())
        product = _process_product(raw, items_path, index)
        entry = attributes.get(asin, {})
        product["Attributes"] = (
            [sys.intern(a) for a in entry["attributes"]] if "attributes" in entry else ["DUMMY_ATTR"]
        )
        if human_goals:
            if asin in human:
                product["instructions"] = human[asin]
        else:
            product["instruction_text"] = entry.get("instruction")
            product["instruction_attributes"] = entry.get("instruction_attributes")
        products.append(product)
        product_by_asin[asin] = product
    if not products:
        raise _fail(items_path, "top level", "no loadable products")

    attribute_to_asins: defaultdict[str, set[str]] = defaultdict(set)
    for p in products:
        for a in p["Attributes"]:
            attribute_to_asins[a].add(p["asin"])
    prices = {p["asin"]: _price_draw(p["pricing"], p["asin"], seed) for p in products}
    goals = build_goals(products, prices, human_goals=human_goals, seed=seed)
    for p in products:
        # Only goal synthesis reads the raw annotations; holding them would cost ~1.5 KB per product.
        p.pop("instructions", None)
    return Catalog(
        data_dir=data_dir,
        products=products,
        product_by_asin=product_by_asin,
        product_prices=prices,
        goals=goals,
        attribute_to_asins=dict(attribute_to_asins),
        human_goals=human_goals,
        seed=seed,
        fingerprint=hasher.hexdigest(),
    )


def default_cache_dir() -> Path:
    """Where generated catalogs and search indexes are cached: ``$PROGPO_CACHE/webshop`` or
    ``~/.cache/progpo/webshop``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "progpo").expanduser() / "webshop"


_COMPLETE_MARKER = "COMPLETE"


def generated_catalog_dir(
    num_products: int, seed: int, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Generate (once, atomically, safe across concurrent workers) and return the cached catalog directory."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"catalog-v{GENERATOR_VERSION}" / f"{num_products}-{seed}"
    if (final / _COMPLETE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        generate_catalog(tmp, num_products, seed, progress=num_products >= 10_000)
        (tmp / _COMPLETE_MARKER).write_text("ok\n")
        try:
            os.rename(tmp, final)
        except OSError:  # another worker finished first (or a stale incomplete dir is in the way)
            if not (final / _COMPLETE_MARKER).is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_catalog(
    num_products: int | None = None,
    seed: int = 0,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    human_goals: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Catalog:
    """The catalog to use when none is given: real data if selected, else a cached generated one.

    Real data is selected by ``data_dir`` or, failing that, the ``WEBSHOP_DATA`` env var; then all its
    products are loaded unless ``num_products`` is given. Otherwise a catalog of ``num_products`` (default
    1000) products is generated with ``seed`` into ``<cache>/catalog-v<version>/<n>-<seed>/`` on first use.

    Example:
        >>> import tempfile
        >>> cat = default_catalog(120, seed=0, cache_dir=tempfile.mkdtemp())
        >>> len(cat.products)
        120
    """
    real = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR) or None
    if real is not None:
        given = "data_dir" if data_dir is not None else DATA_ENV_VAR
        if not Path(real).is_dir():
            state = "is not a folder" if Path(real).exists() else "does not exist"
            raise CatalogMissingError(
                f"the WebShop data folder {real} ({given}) {state}: point {given} at the folder holding "
                f"WebShop's {', '.join(DATA_FILES)} (nothing is downloaded; `progpo webshop generate --out "
                f"DIR` writes a generated one), or unset {given} for the generated catalog"
            )
        try:
            return load_catalog(real, num_products, human_goals=human_goals, seed=seed)
        except CatalogMissingError as exc:
            raise CatalogMissingError(f"the WebShop data in {real} ({given}) is incomplete: {exc}") from None
        except CatalogFormatError as exc:
            raise CatalogFormatError(f"the WebShop data in {real} ({given}) is damaged: {exc}") from None
    n = 1000 if num_products is None else num_products
    folder = generated_catalog_dir(n, seed, cache_dir)
    try:
        return load_catalog(folder, human_goals=human_goals, seed=seed)
    except CatalogFormatError as exc:
        raise CatalogFormatError(
            f"the cached catalog {folder} is damaged ({exc}): delete {folder} to have it generated again"
        ) from None
