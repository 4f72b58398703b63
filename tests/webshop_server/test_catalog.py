"""Catalog generation and loading: determinism, schema, distinct options, hard negatives, real format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as REPO
from webshop_server.catalog import (
    DATA_FILES,
    CatalogFormatError,
    default_catalog,
    generate_catalog,
    generate_main,
    load_catalog,
)
from webshop_server.catalog import generator as gen
from webshop_server.catalog import taxonomy as tx
from webshop_server.catalog.loader import iter_json_list
from webshop_server.goals import NO_PRICE_BOUND, PRICE_RANGE
from webshop_server.reward import fuzzy_match, normalize_color


def _file_bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in DATA_FILES}


def test_same_seed_same_bytes_across_processes(tmp_path):
    first = generate_catalog(tmp_path / "a", 300, seed=7)
    # A second process with a different hash seed must write the very same bytes.
    code = (
        "import sys; from webshop_server.catalog import generate_catalog; "
        "generate_catalog(sys.argv[1], 300, seed=7)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, cwd=REPO, env=env)
    assert _file_bytes(first) == _file_bytes(tmp_path / "b")
    other = generate_catalog(tmp_path / "c", 300, seed=8)
    assert _file_bytes(other)[gen.ITEMS_FILE] != _file_bytes(first)[gen.ITEMS_FILE]


def test_generated_files_follow_webshop_schema(catalog_dir):
    items = json.loads((catalog_dir / gen.ITEMS_FILE).read_text())
    attrs = json.loads((catalog_dir / gen.ATTRS_FILE).read_text())
    human = json.loads((catalog_dir / gen.HUMAN_INS_FILE).read_text())
    assert isinstance(items, list) and len(items) == 1000
    required = {
        "name",
        "asin",
        "product_information",
        "brand",
        "full_description",
        "pricing",
        "images",
        "product_category",
        "small_description",
        "customization_options",
        "category",
        "query",
    }
    for p in items:
        assert required <= p.keys()
        assert p["asin"].startswith("B0") and len(p["asin"]) == 10
        assert p["pricing"] == "" or p["pricing"].startswith("$")
        assert len(p["product_category"].split(tx.BREADCRUMB_SEPARATOR)) >= 3
    assert set(attrs) == {p["asin"] for p in items}
    with_instruction = [e for e in attrs.values() if "instruction" in e]
    assert 0.2 < len(with_instruction) / len(attrs) < 0.6
    assert all(
        e["instruction"].startswith("Find me ") and e["instruction_attributes"] for e in with_instruction
    )
    annotations = [a for v in human.values() for a in v]
    assert len(annotations) > 1000
    openings = Counter(" ".join(a["instruction"].split()[:2]) for a in annotations)
    assert len(openings) >= 10  # many templates, not one
    for a in annotations:
        assert set(a["instruction_attributes"]) <= set(a["attributes"])
        assert len(a["options"]) == len(a["instruction_options"])
    # Price variety: single prices, ranges and a few missing ones.
    kinds = Counter(
        "range" if " - " in p["pricing"] else "missing" if not p["pricing"] else "single" for p in items
    )
    assert kinds["single"] > kinds["range"] > kinds["missing"] > 0


def test_option_pools_are_distinct_and_self_matching():
    for axis, (name, values) in tx.OPTION_POOLS.items():
        # The hand-written pools are already clean: the import-time filter drops nothing.
        assert gen.OPTION_VALUES[axis][1] == values, axis
        assert len(values) >= 3, axis
        assert gen.axis_is_distinct(values), axis
        assert all(gen.matches_own_goal_forms(name, v) for v in values), axis
    # The filter itself catches upstream's lenient matches.
    assert gen.distinct_values(["Large", "X-Large", "7", "7.5", "Navy Blue", "Blue"]) == (
        "Large",
        "7",
        "Navy Blue",
    )
    assert not gen.matches_own_goal_forms("Scent", "Sandalwood")


def test_every_loaded_option_axis_is_distinct(catalog):
    axes = 0
    for product in catalog.products:
        for values in product["options"].values():
            norms = [normalize_color(v) for v in values]
            assert not any(fuzzy_match(a, b) for i, a in enumerate(norms) for b in norms[i + 1 :]), values
            axes += 1
    assert axes > 1000


def test_hard_negatives_differ_in_one_thing(catalog):
    families = defaultdict(list)
    for p in catalog.products:
        families[(p["query"], p["Title"])].append(p)
    siblings = [group for group in families.values() if len(group) > 1]
    assert len(siblings) > 100
    kinds = Counter()
    for group in siblings:
        a, b = group[0], group[1]
        if a["Attributes"] != b["Attributes"]:
            kinds["attribute"] += 1
        elif a["options"] != b["options"]:
            kinds["option"] += 1
        elif a["pricing"] != b["pricing"]:
            kinds["price"] += 1
    assert kinds["option"] > 10 and kinds["price"] > 10
    # Attribute negatives usually change the title too; look them up by leaf + brand + option set.
    by_options = defaultdict(list)
    for p in catalog.products:
        by_options[(p["query"], json.dumps(p["options"]), p["Price"])].append(p)
    assert sum(1 for g in by_options.values() if len(g) > 1 and g[0]["Attributes"] != g[1]["Attributes"]) > 10


def test_goals_are_deterministic_and_well_formed(catalog, catalog_dir):
    again = load_catalog(catalog_dir, seed=0)
    assert again.goals == catalog.goals and again.fingerprint == catalog.fingerprint
    assert again.product_prices == catalog.product_prices
    assert len(catalog.goals) >= 1200  # enough for the 500-goal test split plus a train split
    for goal in catalog.goals:
        product = catalog.product_by_asin[goal["asin"]]
        assert goal["attributes"] and set(goal["goal_options"]) <= {
            v for vs in product["options"].values() for v in vs
        }
        price = catalog.product_prices[goal["asin"]]
        assert goal["price_upper"] > price
        assert goal["price_upper"] in PRICE_RANGE or goal["price_upper"] == NO_PRICE_BOUND
        if goal["price_upper"] != NO_PRICE_BOUND:
            assert goal["instruction_text"].endswith(
                f", and price lower than {goal['price_upper']:.2f} dollars"
            )
    other_seed = load_catalog(catalog_dir, seed=1)
    assert other_seed.fingerprint != catalog.fingerprint
    assert [g["price_upper"] for g in other_seed.goals] != [g["price_upper"] for g in catalog.goals]


def test_synthetic_goals_enumerate_option_combinations(synthetic_catalog):
    per_asin = Counter(g["asin"] for g in synthetic_catalog.goals)
    for asin, count in list(per_asin.items())[:50]:
        product = synthetic_catalog.product_by_asin[asin]
        expected = 1
        for values in product["options"].values():
            expected *= len(values)
        assert count == expected
    goal = next(g for g in synthetic_catalog.goals if len(g["goal_options"]) == 2)
    (n1, v1), (n2, v2) = sorted(goal["goal_options"].items())
    assert f" with {n1}: {v1}, and {n2}: {v2}" in goal["instruction_text"]
    assert goal["instruction_text"].startswith("Find me ")
    assert 0 < goal["weight"] <= 1


def test_generate_main_cli(tmp_path, capsys):
    assert generate_main(["--out", str(tmp_path), "--n", "40", "--seed", "2"]) == 0
    assert "wrote 40 products" in capsys.readouterr().out
    assert len(load_catalog(tmp_path).products) == 40
    with pytest.raises(SystemExit):
        generate_main(["--out", str(tmp_path), "--n", "0"])


def test_default_catalog_caches_and_respects_webshop_data(tmp_path, monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    first = default_catalog(60, seed=3, cache_dir=tmp_path / "cache")
    items = next((tmp_path / "cache").glob("catalog-v*/60-3")) / gen.ITEMS_FILE
    stamp = items.stat().st_mtime_ns
    second = default_catalog(60, seed=3, cache_dir=tmp_path / "cache")
    assert items.stat().st_mtime_ns == stamp and second.fingerprint == first.fingerprint
    real = generate_catalog(tmp_path / "real", 25, seed=9)
    monkeypatch.setenv("WEBSHOP_DATA", str(real))
    assert len(default_catalog(cache_dir=tmp_path / "cache").products) == 25


def test_streaming_parser_matches_json_load(catalog_dir, tmp_path):
    path = catalog_dir / gen.ITEMS_FILE
    streamed = [element for element, _ in iter_json_list(path, chunk_chars=97)]
    assert streamed == json.loads(path.read_text())
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(streamed[:30], separators=(",", ":")))
    assert [e for e, _ in iter_json_list(compact, chunk_chars=5)] == streamed[:30]
    (tmp_path / "empty.json").write_text(" [ ] ")
    assert list(iter_json_list(tmp_path / "empty.json")) == []


def test_num_products_stops_reading_early(tmp_path):
    src = generate_catalog(tmp_path / "src", 50, seed=1)
    text = (src / gen.ITEMS_FILE).read_text()
    # Corrupt the end of the file: loading the first 10 products must never get there.
    (src / gen.ITEMS_FILE).write_text(text[: len(text) * 3 // 4] + "{broken")
    assert len(load_catalog(src, num_products=10).products) == 10
    with pytest.raises(CatalogFormatError, match=r"items_shuffle\.json: element #\d+: invalid JSON"):
        load_catalog(src)


# ---------------------------------------------------------------- a tiny hand-written set in the real format


def _real_format_files(directory: Path) -> Path:
    """Products in the exact layout of WebShop's real files (docs/webshop.md §1.4 "Data schemas")."""
    base = {
        "product_information": {"Manufacturer": "Acme"},
        "brand": "Acme",
        "brand_url": "/stores/Acme",
        "list_price": "",
        "availability_quantity": None,
        "availability_status": "In Stock.",
        "average_rating": 4.5,
        "total_reviews": 10,
        "total_answered_questions": 0,
        "seller_id": "S1",
        "seller_name": "Acme",
        "fulfilled_by_amazon": True,
        "fast_track_message": "",
        "aplus_present": False,
        "small_description_old": "",
        "page": 1,
    }
    # Two products told apart only by name and ASIN (an over-long ASIN, a duplicate one: both dropped).
    placeholder = {
        **base,
        "full_description": "",
        "pricing": "$1",
        "images": ["x"],
        "product_category": "x",
        "small_description": [],
        "customization_options": "",
        "category": "beauty",
        "query": "x",
    }
    items = [
        {
            **base,
            "name": "Acme Men's Rubber Sole Loafers",
            "asin": "B000000001",
            "full_description": "Comfortable loafers with memory foam.",
            "pricing": "$20.50 - $30.50",
            "images": ["https://img/1.jpg", "https://img/1b.jpg"],
            "product_category": "Clothing, Shoes & Jewelry › Men › Shoes › Loafers & Slip-Ons",
            "small_description": ["Slip resistant outsole", "Leather upper"],
            "customization_options": {
                "Color": [
                    {"value": "Black/White", "image": "https://img/c1.jpg"},
                    {"value": "Navy Blue", "image": None},
                ],
                "Size": [{"value": "8", "image": None}, {"value": "9", "image": None}],
                "Style": None,
            },
            "category": "fashion",
            "query": "Men's Loafers & Slip-Ons ",
        },
        {
            **base,
            "name": "Acme Shampoo",
            "asin": "nan",
            "full_description": "",
            "pricing": "$5.00",
            "images": ["x"],
            "product_category": "Beauty",
            "small_description": ["x"],
            "customization_options": "",
            "category": "beauty",
            "query": "shampoo",
        },
        {
            **base,
            "name": "Acme Tea Tree Shampoo",
            "asin": "B000000002",
            "full_description": "Sulfate free.",
            "pricing": "",
            "images": ["https://img/2.jpg"],
            "product_category": "Beauty & Personal Care › Hair Care",
            "small_description": "One bullet as a string",
            "customization_options": "",
            "category": "beauty",
            "query": "shampoo",
        },
        {**placeholder, "name": "Too Long", "asin": "B0000000003X"},
        {**placeholder, "name": "Duplicate", "asin": "B000000001"},
        {
            **base,
            "name": "Acme Tea Kettle",
            "asin": "B000000003",
            "full_description": "Boils water.",
            "pricing": "$995.00",
            "images": ["https://img/3.jpg"],
            "product_category": "Home & Kitchen › Kettles",
            "small_description": ["Stainless steel"],
            "customization_options": "",
            "category": "garden",
            "query": "tea kettle",
        },
    ]
    attrs = {
        "B000000001": {
            "attributes": ["rubber sole", "memory foam"],
            "instruction": "Find me rubber sole loafers",
            "instruction_attributes": ["rubber sole"],
        },
        "B000000002": {"attributes": ["sulfate free", "tea tree"]},
    }
    human = {
        "B000000001": [
            {
                "asin": "B000000001",
                "instruction": "i want black | white loafers with a rubber sole in size 9.",
                "attributes": ["rubber sole", "memory foam"],
                "options": ["color: black | white", "size: 9"],
                "instruction_attributes": ["rubber sole"],
                "instruction_options": ["black | white", "9"],
                "assignment_id": "A1",
                "worker_id": "W1",
            },
            {
                "asin": "B000000001",
                "instruction": "loafers please",
                "attributes": [],
                "options": [],
                "instruction_attributes": [],
                "instruction_options": [],
                "assignment_id": "A2",
                "worker_id": "W2",
            },
        ],
        "B000000003": [
            {
                "asin": "B000000003",
                "instruction": "i need a tea kettle",
                "attributes": [],
                "options": [],
                "instruction_attributes": ["stainless steel"],
                "instruction_options": [],
                "assignment_id": "A3",
                "worker_id": "W3",
            },
        ],
        "B999999999": [],  # annotations of products outside the loaded set are ignored, like upstream
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "items_shuffle_1000.json").write_text(json.dumps(items, ensure_ascii=False))
    (directory / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    (directory / "items_human_ins.json").write_text(json.dumps(human))
    return directory


def test_loads_hand_written_real_format(tmp_path):
    cat = load_catalog(_real_format_files(tmp_path), seed=0)
    # nan, over-long and duplicate asins are dropped like upstream.
    assert [p["asin"] for p in cat.products] == ["B000000001", "B000000002", "B000000003"]
    loafers = cat.product_by_asin["B000000001"]
    assert loafers["Title"] == "Acme Men's Rubber Sole Loafers"
    assert loafers["Description"] == "Comfortable loafers with memory foam."
    assert loafers["BulletPoints"] == ["Slip resistant outsole", "Leather upper"]
    assert loafers["pricing"] == [20.5, 30.5] and loafers["Price"] == "$20.5 to $30.5"
    assert 20.5 <= cat.product_prices["B000000001"] <= 30.5
    assert loafers["options"] == {"color": ["black | white", "navy blue"], "size": ["8", "9"]}
    assert loafers["option_to_image"]["black | white"] == "https://img/c1.jpg"
    assert loafers["MainImage"] == "https://img/1.jpg"
    assert loafers["query"] == "men's loafers & slip-ons"
    assert loafers["Attributes"] == ["rubber sole", "memory foam"]
    assert loafers["Reviews"] == [] and loafers["Rating"] == "N.A."
    assert "brand" not in loafers and "seller_id" not in loafers  # upstream's clean_product_keys
    shampoo = cat.product_by_asin["B000000002"]
    assert shampoo["BulletPoints"] == ["One bullet as a string"]
    assert shampoo["pricing"] == [100.0] and cat.product_prices["B000000002"] == 100.0
    assert cat.product_by_asin["B000000003"]["Attributes"] == ["DUMMY_ATTR"]

    # Human goals: the annotation without instruction_attributes is skipped.
    goals = {g["asin"]: g for g in cat.goals}
    assert len(cat.goals) == 2
    loafer_goal = goals["B000000001"]
    assert loafer_goal["goal_options"] == ["black | white", "9"]
    assert loafer_goal["attributes"] == ["rubber sole"] and loafer_goal["weight"] == 1
    assert loafer_goal["name"] == loafers["name"] and loafer_goal["query"] == loafers["query"]
    steps = [p for p in PRICE_RANGE if p > cat.product_prices["B000000001"]][:4]
    assert loafer_goal["price_upper"] in steps[1:]  # the larger of two draws from the next four $10 steps
    assert loafer_goal["instruction_text"] == (
        f"i want black | white loafers with a rubber sole in size 9, and price lower than "
        f"{loafer_goal['price_upper']:.2f} dollars"
    )
    # $995 has fewer than two $10 steps below $1000 left: no bound and no price text.
    assert goals["B000000003"]["price_upper"] == 1_000_000
    assert goals["B000000003"]["instruction_text"] == "i need a tea kettle"

    synthetic = load_catalog(tmp_path, human_goals=False)
    assert len(synthetic.goals) == 4  # 2 colours x 2 sizes of the only product with an instruction
    assert {g["instruction_text"].split(", and price")[0] for g in synthetic.goals} == {
        f"Find me rubber sole loafers with color: {c}, and size: {s}"
        for c in ("black | white", "navy blue")
        for s in ("8", "9")
    }
    assert all(g["weight"] == 0.25 for g in synthetic.goals)  # 1 / (frequency 4) of its one attribute


@pytest.mark.parametrize(
    ("file", "mutate", "message"),
    [
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[0].pop("images"),
            r"items_shuffle_1000\.json: product #0 \(asin 'B000000001'\): missing field 'images'",
        ),
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[0].update(images=[]),
            r"field 'images' must be a non-empty list",
        ),
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[2].update(pricing="$abc"),
            r"product #2 \(asin 'B000000002'\): field 'pricing' is not a price",
        ),
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[0].update(name=None),
            r"field 'name' must be str, got NoneType",
        ),
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[0].update(customization_options={"Color": "red"}),
            r"customization_options\['Color'\] must be a list or null",
        ),
        (
            "items_shuffle_1000.json",
            lambda items, a, h: items[0].pop("asin"),
            r"product #0: missing field 'asin'",
        ),
        (
            "items_ins_v2_1000.json",
            lambda items, a, h: a["B000000001"].update(attributes="rubber sole"),
            r"items_ins_v2_1000\.json: asin 'B000000001': field 'attributes' must be a list of strings",
        ),
        (
            "items_human_ins.json",
            lambda items, a, h: h["B000000001"][0].pop("instruction"),
            r"items_human_ins\.json: asin 'B000000001' annotation #0: missing field 'instruction'",
        ),
        (
            "items_human_ins.json",
            lambda items, a, h: h["B000000001"][0].update(instruction_options=None),
            r"annotation #0: field 'instruction_options' must be a list of strings",
        ),
    ],
)
def test_validation_errors_name_file_and_field(tmp_path, file, mutate, message):
    directory = _real_format_files(tmp_path)
    paths = [
        directory / n for n in ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json")
    ]
    data = [json.loads(p.read_text()) for p in paths]
    mutate(*data)
    for path, content in zip(paths, data, strict=True):
        path.write_text(json.dumps(content))
    with pytest.raises(CatalogFormatError, match=message):
        load_catalog(directory)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(CatalogFormatError, match="not a directory"):
        load_catalog(tmp_path / "nope")
    directory = _real_format_files(tmp_path / "d")
    (directory / "items_human_ins.json").unlink()
    with pytest.raises(CatalogFormatError, match=r"missing items_human_ins\.json.*nothing is downloaded"):
        load_catalog(directory)
    assert len(load_catalog(directory, human_goals=False).goals) == 4  # not needed for synthetic goals
    (directory / "items_ins_v2_1000.json").write_text("{not json")
    with pytest.raises(CatalogFormatError, match=r"items_ins_v2_1000\.json: whole file: invalid JSON"):
        load_catalog(directory, human_goals=False)
    (directory / "items_shuffle_1000.json").write_text('{"asin": "B1"}')
    (directory / "items_ins_v2_1000.json").write_text("{}")
    with pytest.raises(
        CatalogFormatError, match=r"items_shuffle_1000\.json: top level: expected a JSON list"
    ):
        load_catalog(directory, human_goals=False)
    items = directory / "items_shuffle_1000.json"
    items.write_text('[{"asin": "B1"} {"asin": "B2"}]')
    with pytest.raises(CatalogFormatError, match=r"after element #0: expected ',' or '\]'"):
        list(iter_json_list(items))
    items.write_text('[{"asin": "B1"}, ')
    with pytest.raises(CatalogFormatError, match=r"element #1: invalid JSON"):
        list(iter_json_list(items))
    items.write_text('[{"asin": "B1"}')
    with pytest.raises(
        CatalogFormatError, match=r"after element #0: expected ',' or '\]' but the file ended"
    ):
        list(iter_json_list(items))
    items.write_text("[]")
    with pytest.raises(CatalogFormatError, match=r"top level: no loadable products"):
        load_catalog(directory, human_goals=False)


def test_streaming_holds_one_chunk_not_the_file(catalog_dir):
    # "Stream the 1.18M-product file without loading it twice": iterating keeps about one chunk in memory.
    path = catalog_dir / gen.ITEMS_FILE
    size = path.stat().st_size
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_json_list(path, chunk_chars=1 << 14))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 1000
    assert peak < size / 5, (peak, size)


def test_concurrent_workers_generate_one_cache(tmp_path):
    # Several workers asking for the same default catalog at once: one complete directory, same bytes for all.
    code = (
        "import sys; from webshop_server.catalog import default_catalog; "
        "print(default_catalog(150, seed=4, cache_dir=sys.argv[1]).fingerprint)"
    )
    env = {**os.environ, "WEBSHOP_DATA": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    fingerprints = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(fingerprints) == 1
    dirs = [d for d in (tmp_path / f"catalog-v{gen.GENERATOR_VERSION}").iterdir()]
    assert [d.name for d in dirs] == ["150-4"]  # no leftover temporary directories
