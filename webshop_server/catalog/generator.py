"""Seeded generator of WebShop's raw catalog files (``docs/webshop.md`` §3).

Writes ``items_shuffle.json`` (list of raw products), ``items_ins_v2.json`` (asin -> attributes and, for some
products, a synthetic "Find me ..." instruction) and ``items_human_ins.json`` (asin -> human-style
annotations), in the exact schemas of the real files (``docs/webshop.md`` §1.4 "Data schemas"), so the same
loader and reward run on generated and real data.

What makes the task non-trivial:

* products come in *families*: a base product plus hard negatives that share its leaf, brand, noun and most
  attributes but differ in one attribute, in the values of one option axis, or in price;
* only some attributes are mentioned in the text (the reward's fuzzy path and its substring path are both
  used);
* descriptions mention distractor attributes of sibling leaves;
* option values inside one axis never fuzzy-match each other after colour normalisation (``distinct_values``),
  so picking a wrong value never earns option credit through upstream's lenient ``token_set_ratio``.

Determinism: every draw comes from ``random.Random`` streams seeded from ``(purpose, seed)`` through xxh3-64,
and the JSON is written with a fixed layout, so the same ``(num_products, seed)`` gives byte-identical files
on any machine and Python >= 3.10.
"""

from __future__ import annotations

import json
import os
import random
import string
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from webshop_server.catalog import taxonomy as tx
from webshop_server.reward import fuzzy_match, normalize_color
from webshop_server.seeding import text_seed

# Bump when the generated content changes for a given seed (part of the default cache path).
GENERATOR_VERSION = 2

ITEMS_FILE = "items_shuffle.json"
ATTRS_FILE = "items_ins_v2.json"
HUMAN_INS_FILE = "items_human_ins.json"

_ASIN_ALPHABET = string.digits + string.ascii_uppercase
HUMAN_INSTRUCTION_RATE = 0.75  # share of products with human annotations
SYNTHETIC_INSTRUCTION_RATE = 0.4  # share of products with an items_ins_v2 "instruction"
NO_OPTIONS_RATE = 0.08
RANGE_PRICE_RATE = 0.15
MISSING_PRICE_RATE = 0.01


def rng_for(purpose: str, seed: int) -> random.Random:
    """An independent, portable random stream for ``purpose`` under ``seed`` (xxh3-64 of both)."""
    return random.Random(text_seed(f"{purpose}:{seed}"))


def loaded_option_value(raw_value: str) -> str:
    """How upstream's loader stores an option value: stripped, "/" -> " | ", lowercased."""
    return raw_value.strip().replace("/", " | ").lower()


def distinct_values(values: Iterable[str]) -> tuple[str, ...]:
    """Keep, in order, the values that do not fuzzy-match an already kept one (after loading + colour norm).

    Example:
        >>> distinct_values(["Large", "X-Large", "Small", "Navy Blue", "Blue"])
        ('Large', 'Small', 'Navy Blue')
    """
    kept: list[str] = []
    for value in values:
        norm = normalize_color(loaded_option_value(value))
        if all(not fuzzy_match(norm, normalize_color(loaded_option_value(k))) for k in kept):
            kept.append(value)
    return tuple(kept)


def axis_is_distinct(values: Sequence[str]) -> bool:
    """Whether no two values of one option axis fuzzy-match after loading and colour normalisation."""
    norms = [normalize_color(loaded_option_value(v)) for v in values]
    return all(not fuzzy_match(a, b) for i, a in enumerate(norms) for b in norms[i + 1 :])


def matches_own_goal_forms(name: str, value: str) -> bool:
    """Whether buying ``value`` satisfies both goal forms of it after colour normalisation.

    Human goals hold the value, synthetic goals the ``(name, value)`` tuple, and upstream's
    ``normalize_color`` treats the two differently: "sandalwood" becomes "sand" (substring) while ``("scent",
    "sandalwood")`` stays as is (element test), so the right purchase would score 40 against its own synthetic
    goal.

    Example:
        >>> matches_own_goal_forms("Scent", "Lavender"), matches_own_goal_forms("Scent", "Sandalwood")
        (True, False)
    """
    bought = normalize_color(loaded_option_value(value))
    goal_forms = (loaded_option_value(value), (name.lower(), loaded_option_value(value)))
    return all(fuzzy_match(bought, normalize_color(form)) for form in goal_forms)


# Option pools without values that collide with each other or fail their own goals, computed once.
OPTION_VALUES: dict[str, tuple[str, tuple[str, ...]]] = {
    axis: (name, distinct_values(v for v in values if matches_own_goal_forms(name, v)))
    for axis, (name, values) in tx.OPTION_POOLS.items()
}


@dataclass(frozen=True)
class _Spec:
    """What distinguishes one product of a family from another."""

    leaf: tx.Leaf
    brand: str
    noun: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (axis key, raw values)
    price: float
    price_high: float | None  # a "$lo - $hi" range when set
    title_style: int


def _title_case(phrase: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in phrase.split())


def _price_text(spec: _Spec, missing: bool) -> str:
    if missing:
        return ""
    if spec.price_high is not None:
        return f"${spec.price:.2f} - ${spec.price_high:.2f}"
    return f"${spec.price:.2f}"


def _draw_price(rng: random.Random, low: float, high: float) -> float:
    return max(0.99, round(rng.uniform(low, high)) - 0.01)


def _base_spec(rng: random.Random) -> _Spec:
    leaf = rng.choice(tx.LEAVES)
    attrs = tuple(rng.sample(leaf.attributes, rng.randint(2, min(4, len(leaf.attributes)))))
    options: list[tuple[str, tuple[str, ...]]] = []
    if rng.random() >= NO_OPTIONS_RATE:
        for axis in leaf.option_axes:
            pool = OPTION_VALUES[axis][1]
            chosen = set(rng.sample(pool, rng.randint(2, min(6, len(pool)))))
            options.append((axis, tuple(v for v in pool if v in chosen)))  # keep pool order (sizes ascend)
    price = _draw_price(rng, *leaf.price)
    price_high = round(price * rng.uniform(1.15, 1.8), 2) if rng.random() < RANGE_PRICE_RATE else None
    return _Spec(
        leaf,
        rng.choice(tx.BRANDS),
        rng.choice(leaf.nouns),
        attrs,
        tuple(options),
        price,
        price_high,
        rng.randrange(4),
    )


def _hard_negative(rng: random.Random, base: _Spec) -> _Spec:
    """A sibling of ``base`` that differs in exactly one attribute, option axis or price."""
    kinds = ["attribute", "price"]
    if base.options:
        kinds.append("option")
    kind = rng.choice(kinds)
    if kind == "attribute":
        unused = [a for a in base.leaf.attributes if a not in base.attributes]
        if unused:
            attrs = list(base.attributes)
            attrs[rng.randrange(len(attrs))] = rng.choice(unused)
            return replace(base, attributes=tuple(attrs))
        kind = "price"
    if kind == "option":
        i = rng.randrange(len(base.options))
        axis, values = base.options[i]
        others = [v for v in OPTION_VALUES[axis][1] if v not in values]
        if others:
            new_values = tuple(others[: max(2, min(len(others), len(values)))])
            options = list(base.options)
            options[i] = (axis, new_values)
            return replace(base, options=tuple(options))
    # price: above any bound a goal on the base product can get (bounds are <= 4 x $10 above its price)
    highest = base.price_high if base.price_high is not None else base.price
    return replace(base, price=round(highest * rng.uniform(1.5, 2.5) + 45, 2), price_high=None)


def _title(spec: _Spec) -> str:
    leaf = spec.leaf
    gender = ""
    if leaf.query.startswith("women's"):
        gender = "Women's "
    elif leaf.query.startswith("men's"):
        gender = "Men's "
    first = _title_case(spec.attributes[0])
    noun = _title_case(spec.noun)
    rest = [_title_case(a) for a in spec.attributes[1:]]
    if spec.title_style == 0:
        return f"{spec.brand} {gender}{first} {noun}"
    if spec.title_style == 1:
        tail = f", {rest[0]}" if rest else ""
        return f"{spec.brand} {gender}{noun}{tail}"
    if spec.title_style == 2:
        tail = f", {', '.join(rest[:2])}" if rest else ""
        return f"{spec.brand} {first} {gender}{noun}{tail}"
    return f"{spec.brand} {gender}{noun} - {first} Design for Everyday Use"


def _description(rng: random.Random, spec: _Spec, mentioned: Sequence[str]) -> str:
    leaf = spec.leaf
    pool = tx.DESCRIPTION_SENTENCES[leaf.category]
    fmt = {"brand": spec.brand, "noun": spec.noun}
    sentences = [pool[0].format(**fmt)]
    sentences += [rng.choice(tx.ATTRIBUTE_SENTENCES).format(attr=a) for a in mentioned]
    if rng.random() < 0.3:  # a distractor attribute from a sibling leaf of the same category
        siblings = [x for x in tx.LEAVES if x.category == leaf.category and x is not leaf]
        distractor = rng.choice(rng.choice(siblings).attributes)
        if distractor not in spec.attributes:
            sentences.append(f"Unlike products that only advertise {distractor}, it is built to last.")
    sentences += [s.format(**fmt) for s in rng.sample(pool[1:], rng.randint(2, 4))]
    return " ".join(sentences)


def _bullets(rng: random.Random, spec: _Spec, mentioned: Sequence[str]) -> list[str]:
    fmt = {"brand": spec.brand, "noun": spec.noun}
    attr_templates = tx.BULLET_TEMPLATES[:2]
    bullets = [rng.choice(attr_templates).format(ATTR=a.upper(), attr=a, **fmt) for a in mentioned]
    generic = [t.format(**fmt) for t in tx.BULLET_TEMPLATES[2:]]
    bullets += rng.sample(generic, max(1, min(len(generic), rng.randint(3, 5) - len(bullets))))
    return bullets


def _hex_id(rng: random.Random, n: int) -> str:
    """n upper-case hex digits (ids nobody reads: seller, annotation assignment and worker)."""
    return f"{rng.getrandbits(4 * n):0{n}X}"


def _random_id(rng: random.Random, n: int) -> str:
    """n base-36 characters (digits and capitals), from one ``getrandbits`` draw."""
    value = rng.getrandbits(6 * n)
    chars = []
    for _ in range(n):
        value, digit = divmod(value, 36)
        chars.append(_ASIN_ALPHABET[digit])
    return "".join(chars)


def _raw_product(rng: random.Random, spec: _Spec, asin: str, page: int) -> dict[str, Any]:
    leaf = spec.leaf
    mentioned = [a for a in spec.attributes if rng.random() < 0.6]
    text_attrs = [a for a in mentioned if rng.random() < 0.7]
    bullet_attrs = [a for a in mentioned if a not in text_attrs]
    bullets: list[str] | str = _bullets(rng, spec, bullet_attrs)
    if rng.random() < 0.05:  # upstream's files sometimes hold one string instead of a list
        bullets = " ".join(bullets)
    customization: dict[str, list[dict[str, Any]] | None] | str = ""
    if spec.options:
        customization = {}
        for axis, values in spec.options:
            name = tx.OPTION_POOLS[axis][0]
            customization[name] = [{"value": v, "image": None} for v in values]
    missing_price = rng.random() < MISSING_PRICE_RATE
    name = _title(spec)
    return {
        "name": name,
        "asin": asin,
        "product_information": {
            "Product Dimensions": (
                f"{rng.randint(2, 40)} x {rng.randint(2, 30)} x {rng.randint(1, 20)} inches"
            ),
            "Item Weight": f"{rng.randint(1, 90) / 10:.1f} pounds",
            "Manufacturer": spec.brand,
            "ASIN": asin,
        },
        "brand": spec.brand,
        "brand_url": f"/stores/{spec.brand}/page/{rng.randrange(10**8):08d}",
        "full_description": _description(rng, spec, text_attrs),
        "pricing": _price_text(spec, missing_price),
        "list_price": "" if rng.random() < 0.7 else f"${spec.price * 1.25:.2f}",
        "availability_quantity": None,
        "availability_status": "In Stock." if rng.random() < 0.9 else "Only 3 left in stock - order soon.",
        "images": [f"/static/images/placeholder-{leaf.category}.svg"],
        "product_category": tx.BREADCRUMB_SEPARATOR.join(leaf.breadcrumb),
        "average_rating": round(rng.uniform(3.0, 5.0), 1),
        "small_description": bullets,
        "total_reviews": rng.randint(0, 5000),
        "total_answered_questions": rng.randint(0, 60),
        "customization_options": customization,
        "seller_id": _hex_id(rng, 13),
        "seller_name": f"{spec.brand} Store",
        "fulfilled_by_amazon": rng.random() < 0.6,
        "fast_track_message": "",
        "aplus_present": rng.random() < 0.3,
        "small_description_old": "",
        "category": leaf.category,
        "query": leaf.query,
        "page": page,
    }


def _join_attrs(attrs: Sequence[str], rng: random.Random) -> str:
    if len(attrs) == 1:
        return attrs[0]
    glue = rng.choice([" and ", ", "])
    return ", ".join(attrs[:-1]) + glue + attrs[-1]


# How annotators say an option name in prose (the raw names are Amazon's, e.g. "Item Package Quantity").
_SPOKEN_OPTION_NAMES = {"flavor name": "flavor", "item package quantity": "pack size"}


def _option_phrase(rng: random.Random, name: str, value: str) -> str:
    key = name if name in tx.OPTION_PHRASES else "*"
    return rng.choice(tx.OPTION_PHRASES[key]).format(name=_SPOKEN_OPTION_NAMES.get(name, name), value=value)


def _human_annotation(rng: random.Random, spec: _Spec, asin: str) -> dict[str, Any]:
    attrs = rng.sample(spec.attributes, rng.randint(1, min(3, len(spec.attributes))))
    chosen = [
        (tx.OPTION_POOLS[axis][0].lower(), loaded_option_value(rng.choice(values)))
        for axis, values in spec.options
    ]
    noun = spec.noun if rng.random() < 0.7 else rng.choice(spec.leaf.nouns)
    text = rng.choice(tx.INSTRUCTION_BODIES).format(
        opener=rng.choice(tx.INSTRUCTION_OPENERS),
        article=spec.leaf.article,
        noun=noun,
        attrs=_join_attrs(attrs, rng),
        options="".join(_option_phrase(rng, n, v) for n, v in chosen),
    )
    if rng.random() < 0.5:
        text += "."
    return {
        "asin": asin,
        "instruction": text,
        "attributes": list(spec.attributes),
        "options": [f"{n}: {v}" for n, v in chosen],
        "instruction_attributes": attrs,
        "instruction_options": [v for _, v in chosen],
        "assignment_id": _hex_id(rng, 30),
        "worker_id": _hex_id(rng, 14),
    }


def _specs(rng: random.Random, num_products: int) -> list[_Spec]:
    specs: list[_Spec] = []
    while len(specs) < num_products:
        base = _base_spec(rng)
        specs.append(base)
        for _ in range(rng.choices((0, 1, 2, 3), weights=(3, 3, 2.5, 1.5))[0]):
            if len(specs) < num_products:
                specs.append(_hard_negative(rng, base))
    return specs


def _dump_list(items: Sequence[Any]) -> str:
    # One record per line: readable, streamable, and a fixed layout for byte-identical output.
    return "[\n" + ",\n".join(json.dumps(x, ensure_ascii=False) for x in items) + "\n]\n"


def _dump_dict(mapping: dict[str, Any]) -> str:
    lines = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in mapping.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate_catalog(
    out_dir: str | os.PathLike[str], num_products: int, seed: int = 0, *, progress: bool = False
) -> Path:
    """Write a generated WebShop catalog (the three raw files) into ``out_dir``; returns ``out_dir``.

    Args:
        out_dir: directory to write into (created if missing); existing files of the same names are replaced.
        num_products: number of products (1k / 10k / 100k are the presets; any n >= 1 works).
        seed: the catalog seed; the same ``(num_products, seed)`` gives byte-identical files.
        progress: show a progress bar.

    Example:
        >>> import tempfile
        >>> d = generate_catalog(tempfile.mkdtemp(), num_products=50, seed=3)
        >>> sorted(p.name for p in d.iterdir())
        ['items_human_ins.json', 'items_ins_v2.json', 'items_shuffle.json']
    """
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec_rng = rng_for("specs", seed)
    text_rng = rng_for("text", seed)
    asin_rng = rng_for("asin", seed)
    ins_rng = rng_for("instructions", seed)

    specs = _specs(spec_rng, num_products)
    products: list[dict[str, Any]] = []
    ins_v2: dict[str, dict[str, Any]] = {}
    human: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for i, spec in enumerate(tqdm(specs, desc="generate catalog", disable=not progress, unit="product")):
        asin = "B0" + _random_id(asin_rng, 8)
        while asin in seen:
            asin = "B0" + _random_id(asin_rng, 8)
        seen.add(asin)
        products.append(_raw_product(text_rng, spec, asin, page=1 + i // 16))
        entry: dict[str, Any] = {"attributes": list(spec.attributes)}
        if ins_rng.random() < SYNTHETIC_INSTRUCTION_RATE:
            attrs = ins_rng.sample(spec.attributes, ins_rng.randint(1, min(2, len(spec.attributes))))
            entry["instruction"] = f"Find me {', '.join(attrs)} {spec.leaf.query}"
            entry["instruction_attributes"] = attrs
        ins_v2[asin] = entry
        if ins_rng.random() < HUMAN_INSTRUCTION_RATE:
            count = ins_rng.choice((1, 1, 2, 2, 3))
            human[asin] = [_human_annotation(ins_rng, spec, asin) for _ in range(count)]
    # items_shuffle.json is, as its name says, shuffled: families must not sit next to each other.
    rng_for("shuffle", seed).shuffle(products)

    _write_atomic(out / ITEMS_FILE, _dump_list(products))
    _write_atomic(out / ATTRS_FILE, _dump_dict(ins_v2))
    _write_atomic(out / HUMAN_INS_FILE, _dump_dict(human))
    return out
