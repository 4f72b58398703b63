"""Goal synthesis from loaded products, as upstream's ``web_agent_site/engine/goal.py`` does it, but seeded.

* ``get_human_goals``: one goal per human annotation (``items_human_ins.json``) of a loaded product, skipping
  annotations without ``instruction_attributes``; ``goal_options`` is the list ``instruction_options``;
  weight 1.
* ``get_synthetic_goals``: for products whose ``items_ins_v2`` entry has an ``instruction``, one goal per
  element of the Cartesian product of all option values (option names sorted); ``goal_options`` is a dict name
  -> value; weight = mean over the goal's attributes of 1 / attribute frequency.
* Price bound: upstream takes the next four multiples of $10 above the product price and keeps the larger of
  two draws; ", and price lower than X.00 dollars" is appended (no bound, 1e6, with fewer than two steps).
  Upstream draws from the unseeded global ``random`` before seeding, so bounds differ per process
  (``docs/webshop.md`` §1.3 quirk 4). Here each goal's draw comes from xxh3-64 of (seed, asin, goal
  number), so every process builds the same goals.
* ``build_goals`` then shuffles with ``random.Random(233)`` like upstream's ``random.seed(233);
  random.shuffle(goals)``; the RL papers' splits index this list (test 0-499, train 500+).
"""

from __future__ import annotations

import bisect
import itertools
import random
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from webshop_server.seeding import text_seed

PRICE_RANGE: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_BOUND = 1_000_000.0
GOAL_SHUFFLE_SEED = 233


def price_bound(price: float, key: str, seed: int) -> tuple[float, str]:
    """Upstream's goal price bound and its instruction suffix, drawn deterministically from ``(seed, key)``.

    Example:
        >>> bound, text = price_bound(23.5, "B0TEST:0", seed=0)
        >>> bound in (40.0, 50.0, 60.0), text == f", and price lower than {bound:.2f} dollars"
        (True, True)
    """
    start = bisect.bisect_right(PRICE_RANGE, price)  # upstream: [p for p in PRICE_RANGE if p > price][:4]
    steps = PRICE_RANGE[start : start + 4]
    n = len(steps)
    if n < 2:
        return NO_PRICE_BOUND, ""
    # Two distinct step indices, uniform over ordered pairs like random.sample(steps, 2), from one hash.
    h = text_seed(f"price_upper:{seed}:{key}")
    first, second = h % n, (h // n) % (n - 1)
    second += second >= first
    upper = steps[max(first, second)]
    return upper, f", and price lower than {upper:.2f} dollars"


def get_human_goals(
    products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], seed: int
) -> list[dict[str, Any]]:
    """Goals from the human annotations attached to ``products`` (``product["instructions"]``), unshuffled."""
    goals: list[dict[str, Any]] = []
    for item in products:
        asin = item["asin"]
        for k, annotation in enumerate(item.get("instructions", ())):
            attributes = annotation["instruction_attributes"]
            if not attributes:
                continue
            upper, price_text = price_bound(prices[asin], f"{asin}:{k}", seed)
            goals.append(
                {
                    "asin": asin,
                    "category": item["category"],
                    "query": item["query"],
                    "name": item["name"],
                    "product_category": item["product_category"],
                    "instruction_text": annotation["instruction"].strip(".") + price_text,
                    "attributes": [sys.intern(a) for a in attributes],
                    "price_upper": upper,
                    "goal_options": [sys.intern(o) for o in annotation["instruction_options"]],
                    "weight": 1,
                }
            )
    return goals


def get_synthetic_goals(
    products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], seed: int
) -> list[dict[str, Any]]:
    """Goals from ``items_ins_v2`` instructions, one per combination of option values, unshuffled."""
    goals: list[dict[str, Any]] = []
    attribute_counts: defaultdict[str, int] = defaultdict(int)
    for product in products:
        instruction = product.get("instruction_text")
        if instruction is None:
            continue
        asin = product["asin"]
        attributes = list(product["instruction_attributes"] or ())
        if not attributes:
            continue  # upstream asserts; a real file never has an instruction without attributes
        upper, price_text = price_bound(prices[asin], asin, seed)
        options = product["options"]
        names = sorted(options)
        for combination in itertools.product(*(options[n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": asin,
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],
                    "product_category": product["product_category"],
                    "instruction_text": f"{instruction}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": upper,
                    "goal_options": goal_options,
                }
            )
            for attribute in attributes:
                attribute_counts[attribute] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / attribute_counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def build_goals(
    products: Sequence[Mapping[str, Any]],
    prices: Mapping[str, float],
    *,
    human_goals: bool = True,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """All goals of a loaded catalog, shuffled with seed 233 like upstream."""
    goals = (get_human_goals if human_goals else get_synthetic_goals)(products, prices, seed)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals
