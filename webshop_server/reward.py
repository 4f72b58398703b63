"""WebShop's purchase reward, re-implemented from the paper's formula (Yao et al., 2022).

Restates ``web_agent_site/engine/goal.py::get_reward`` of princeton-nlp/WebShop (commit 64fa2a5), described in
``docs/webshop.md`` §1.2 "Reward"::

    reward = (matched_attributes + matched_options + price_ok) / (|attributes| + |goal_options| + 1) * r_type

* An attribute matches if it fuzzy-matches (``token_set_ratio`` > 85) an entry of the product's
  ``Attributes``, or appears verbatim in its lowercased ``Title``, joined ``BulletPoints`` or ``Description``.
* Options are colour-normalised (``normalize_color``), then a goal option matches if some purchased option has
  ``token_set_ratio`` > 85. Synthetic goals store ``goal_options`` as a dict; upstream then fuzzy-matches the
  ``(name, value)`` tuples, which only works through the subset rule. We reproduce that exactly.
* ``price_ok`` is 1 when ``price <= goal["price_upper"]``.
* ``r_type`` (type factor) from the scrape ``query``, the ``product_category`` breadcrumb and the nouns of the
  product names (see ``get_type_reward``).

Fuzzy matching uses rapidfuzz with thefuzz's pre-processing (``str()``, ASCII-only, lowercase, punctuation to
spaces) and thefuzz's rounding to an int, so scores equal thefuzz's ``fuzz.token_set_ratio``.

Noun extraction for ``title_score`` (``NounExtractor``): upstream tags the product names with spaCy
``en_core_web_sm`` and keeps NOUN/PROPN tokens. No official model can be installed offline, so by default
(``auto``) we use spaCy only when ``en_core_web_sm`` is importable and otherwise a built-in deterministic
heuristic: the lowercased word tokens of the name (spaCy-style: "women's" -> "women"), minus stopwords,
numbers, units, colours and a closed list of common adjectives. The heuristic keeps some adjectives spaCy
would drop (e.g. "waterproof" when it is not in the list) and drops none of the brand words (spaCy tags those
PROPN too), so ``title_score`` can differ from upstream's on real data; on generated data the head noun phrase
decides it either way. Choose with ``set_noun_extractor`` or the ``PROGPO_WEBSHOP_NOUNS`` env var (``auto`` |
``heuristic`` | ``spacy``). Verbose output names the extractor used.

Example:
    >>> product = {"Title": "Acme Rubber Sole Sneakers", "name": "Acme Rubber Sole Sneakers",
    ...            "BulletPoints": ["lace up"], "Description": "", "Attributes": ["rubber sole"],
    ...            "query": "sneakers", "product_category": "Shoes › Athletic › Running"}
    >>> goal = {"attributes": ["rubber sole"], "goal_options": ["blue"], "price_upper": 50.0,
    ...         "query": "sneakers", "product_category": "Shoes › Athletic › Running",
    ...         "name": "Acme Rubber Sole Sneakers"}
    >>> get_reward(product, goal, price=30.0, options={"color": "navy blue"})
    1.0
"""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

FUZZY_THRESHOLD = 85  # upstream: a match needs token_set_ratio > 85

# Upstream's web_agent_site/engine/normalize.py COLOR_SET: alphabetical, and normalize_color returns the first
# entry that is a substring of the option, so "navy blue" -> "blue", "rose gold" -> "gold".
COLOR_SET: tuple[str, ...] = tuple(
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown "
    "burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac "
    "copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite "
    "grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light "
    "lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy "
    "nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell "
    "silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut "
    "wheat white wine yellow".split()
)


def normalize_color(option: Any) -> Any:
    """Upstream ``normalize_color``: the first ``COLOR_SET`` entry contained in ``option``, else ``option``.

    ``in`` is a substring test for strings and an element test for the ``(name, value)`` tuples of synthetic
    goals, exactly as upstream.

    Example:
        >>> normalize_color("navy blue"), normalize_color("xl"), normalize_color(("color", "red"))
        ('blue', 'xl', 'red')
    """
    if not isinstance(option, (str, tuple)):
        option = str(option)
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def _full_process(text: Any) -> str:
    # thefuzz.utils.full_process(s, force_ascii=True): str(), drop non-ASCII, rapidfuzz's default_process.
    return default_process(str(text).encode("ascii", "ignore").decode("ascii"))


def fuzzy_score(a: Any, b: Any) -> int:
    """thefuzz's ``fuzz.token_set_ratio(a, b)``: 0..100, rounded like thefuzz.

    Example:
        >>> fuzzy_score("large", "x-large"), fuzzy_score("navy", "teal")
        (100, 25)
    """
    pa, pb = _full_process(a), _full_process(b)
    if not pa or not pb:
        return 0
    return int(round(fuzz.token_set_ratio(pa, pb)))


def fuzzy_match(a: Any, b: Any) -> bool:
    """Whether upstream counts ``a`` and ``b`` as the same (``token_set_ratio`` > 85)."""
    return fuzzy_score(a, b) > FUZZY_THRESHOLD


class NounExtractor(str, enum.Enum):
    """How ``title_score`` finds the nouns of a product name."""

    AUTO = "auto"  # spaCy if en_core_web_sm is importable, else the heuristic
    HEURISTIC = "heuristic"
    SPACY = "spacy"


_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in into is it its of on or over per set the this that to "
    "up with without your you our new pcs pc piece pieces pack count ct size inch inches in ft oz fl lb lbs "
    "ml mm cm kg g x w l".split()
)
# Adjectives/modifiers that spaCy tags ADJ/ADV in typical titles; colours come from COLOR_SET.
_ADJECTIVES = frozenset(
    "adjustable anti aluminum best breathable classic comfortable compact cool casual cute deep dry "
    "durable easy "
    "elastic extra fast free fresh full gentle great heavy high large light lightweight long low mini modern "
    "natural non organic original oversized perfect portable premium pure quick raw real regular slim small "
    "smart soft solid super thick thin ultra vintage waterproof wide wireless women's men's unisex".split()
)
_TOKEN = re.compile(r"[a-z]+")


@functools.lru_cache(maxsize=65536)
def _heuristic_nouns(name: str) -> tuple[str, ...]:
    # spaCy splits "women's" into "women" + "'s"; r"[a-z]+" does the same for the alphabetic part.
    tokens = _TOKEN.findall(name.lower())
    return tuple(
        t
        for t in tokens
        if len(t) > 1 and t not in _STOPWORDS and t not in _ADJECTIVES and t not in COLOR_SET
    )


@functools.lru_cache(maxsize=1)
def _spacy_model():
    import spacy  # optional; only when a model is installed

    return spacy.load("en_core_web_sm")


@functools.lru_cache(maxsize=65536)
def _spacy_nouns(name: str) -> tuple[str, ...]:
    return tuple(t.text.lower() for t in _spacy_model()(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN"))


def _spacy_available() -> bool:
    try:
        _spacy_model()
    except Exception:  # noqa: BLE001 - any import/load failure means "not installed"
        return False
    return True


_noun_extractor: NounExtractor | None = None


def set_noun_extractor(mode: NounExtractor | str) -> NounExtractor:
    """Select the noun extractor for ``title_score``; returns the resolved one (never ``AUTO``).

    Raises:
        RuntimeError: ``spacy`` was requested but spaCy or ``en_core_web_sm`` is not installed.
    """
    global _noun_extractor
    mode = NounExtractor(mode)
    if mode is NounExtractor.AUTO:
        mode = NounExtractor.SPACY if _spacy_available() else NounExtractor.HEURISTIC
    elif mode is NounExtractor.SPACY and not _spacy_available():
        raise RuntimeError(
            "noun extractor 'spacy' needs spaCy and the en_core_web_sm model installed "
            "(`pip install spacy` plus a model wheel); nothing is downloaded at run time"
        )
    _noun_extractor = mode
    return mode


def noun_extractor() -> NounExtractor:
    """The noun extractor in use (resolved from ``PROGPO_WEBSHOP_NOUNS`` on first use, default ``auto``)."""
    if _noun_extractor is None:
        return set_noun_extractor(os.environ.get("PROGPO_WEBSHOP_NOUNS", NounExtractor.AUTO.value))
    return _noun_extractor


def name_nouns(name: str) -> tuple[str, ...]:
    """The NOUN/PROPN tokens of a product name (lowercased, in order, duplicates kept like upstream).

    Example:
        >>> set_noun_extractor("heuristic").value, name_nouns("Acme Women's Lightweight Running Shoes, Black")
        ('heuristic', ('acme', 'women', 'running', 'shoes'))
    """
    if noun_extractor() is NounExtractor.SPACY:
        return _spacy_nouns(name)
    return _heuristic_nouns(name)


def get_type_reward(purchased_product: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream ``get_type_reward``: is the purchase the same kind of product as the goal?

    Returns ``r_type`` and its signals ``query_match``, ``category_match`` and ``title_score``.
    """
    query_match = purchased_product["query"] == goal["query"]
    purchased_category = {x.strip() for x in purchased_product["product_category"].split("›")}
    goal_category = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_category & goal_category) >= 2

    purchased_nouns = name_nouns(purchased_product["name"])
    desired_nouns = name_nouns(goal["name"])
    if not desired_nouns:
        title_score = 0.2
    else:
        # Upstream divides by the token *list* length (duplicates count) and intersects the sets.
        title_score = len(set(purchased_nouns) & set(desired_nouns)) / len(desired_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def get_attribute_reward(purchased_product: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """Upstream ``get_attribute_reward``: (fraction, count) of goal attributes the product has."""
    purchased_attrs = purchased_product["Attributes"]
    goal_attrs = goal["attributes"]
    title = purchased_product["Title"].lower()
    bullets = " ".join(purchased_product["BulletPoints"]).lower()
    description = purchased_product["Description"].lower()
    matches = 0
    for g_attr in goal_attrs:
        if any(fuzzy_match(p_attr, g_attr) for p_attr in purchased_attrs):
            matches += 1
        elif g_attr in title or g_attr in bullets or g_attr in description:
            matches += 1
    return (matches / len(goal_attrs) if goal_attrs else 0.0), matches


def get_option_reward(
    purchased_options: Iterable[Any], goal_options: Iterable[Any]
) -> tuple[float | None, int]:
    """Upstream ``get_option_reward``: (fraction, or None without goal options; count) of options bought."""
    purchased = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(1 for g in wanted if any(fuzzy_match(p, g) for p in purchased))
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    purchased_product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    verbose: bool = False,
) -> float | dict[str, Any]:
    """WebShop's reward for buying ``purchased_product`` at ``price`` with ``options`` for ``goal``.

    Args:
        purchased_product: the loaded product (``Title``, ``BulletPoints``, ``Description``, ``Attributes``,
            ``name``, ``query``, ``product_category``), as in ``Catalog.product_by_asin``.
        goal: a goal from ``Catalog.goals`` (``attributes``, ``goal_options``, ``price_upper``, ``query``,
            ``product_category``, ``name``).
        price: the product's price (``Catalog.product_prices[asin]``).
        options: the options the agent chose, option name -> value (values are what is scored).
        verbose: return every component instead of the number.

    Returns:
        The reward in [0, 1]; with ``verbose`` a dict with ``reward``, ``r_att``, ``r_option`` (None without
        goal options), ``r_price``, ``r_type``, the weights ``w_att``/``w_option``/``w_price``, the match
        counts ``num_attr_matches``/``num_option_matches``, the type signals ``query_match``,
        ``category_match``, ``title_score`` and ``noun_extractor``. Then ``reward == (num_attr_matches +
        num_option_matches + r_price) / (|A| + |O| + 1) * r_type``.
    """
    type_info = get_type_reward(purchased_product, goal)
    # Upstream: r_price = (price <= price_upper) if price_upper > 0 else None (then the sum fails); our goals
    # always have a positive bound.
    r_price = float(price <= goal["price_upper"])
    r_att, num_attr_matches = get_attribute_reward(purchased_product, goal)
    goal_options: Sequence[Any] | Mapping[str, Any] = goal["goal_options"]
    goal_option_items = (
        list(goal_options.items()) if isinstance(goal_options, Mapping) else list(goal_options)
    )
    r_option, num_option_matches = get_option_reward(list(options.values()), goal_option_items)

    denominator = len(goal["attributes"]) + len(goal_option_items) + 1
    reward = (num_attr_matches + num_option_matches + r_price) / denominator * type_info["r_type"]
    if not verbose:
        return reward
    return {
        "reward": reward,
        "r_att": r_att,
        "r_option": r_option,
        "r_price": r_price,
        "r_type": type_info["r_type"],
        "w_att": len(goal["attributes"]) / denominator,
        "w_option": len(goal_option_items) / denominator,
        "w_price": 1 / denominator,
        "num_attr_matches": num_attr_matches,
        "num_option_matches": num_option_matches,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
        "noun_extractor": noun_extractor().value,
    }
