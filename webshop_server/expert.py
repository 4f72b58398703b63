"""A scripted WebShop expert: reads the goal (server side), finds the target, picks its options, buys.

The expert is a pure function of the engine's session state, so it can be asked for "the next action" at any
point of an episode, including after an agent's detours: from the search page it searches the target's title;
on a results page it pages towards the target (or goes back to search when the target is not listed); on
another product it goes back; on the target it clicks every goal option not yet chosen, then Buy Now.

It reads the goal, so it exists for tests, demonstrations and warm starts only; agents never see what it
reads.

Example:
    >>> from webshop_server.expert import expert_action  # doctest: +SKIP
    >>> expert_action(engine, session)  # doctest: +SKIP
    'search[ultra soft cotton crew socks for men]'
"""

from __future__ import annotations

from collections.abc import Iterable

from rapidfuzz import fuzz

from webshop_server.engine import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PREV_PAGE,
    PRODUCT_WINDOW,
    PageKind,
    Session,
    WebShopEngine,
)


def goal_option_values(goal: dict) -> list[str]:
    """The option values a goal asks for (human goals list values; synthetic goals map name -> value)."""
    options = goal.get("goal_options") or []
    values: Iterable = options.values() if isinstance(options, dict) else options
    return [str(v).strip().lower() for v in values if str(v).strip()]


def target_options(product: dict, goal: dict) -> dict[str, str]:
    """The product's option per axis that best matches each goal option (exact value first, then fuzzy)."""
    axes = product.get("options") or {}
    chosen: dict[str, str] = {}
    for wanted in goal_option_values(goal):
        best: tuple[float, str, str] | None = None
        for name, values in axes.items():
            for value in values:
                score = 101.0 if value == wanted else fuzz.token_set_ratio(value, wanted)
                if best is None or score > best[0]:
                    best = (score, name, value)
        if best is not None and best[1] not in chosen:
            chosen[best[1]] = best[2]
    return chosen


def search_query(product: dict) -> str:
    """What the expert types: the target's title, lowercased (its own words rank it first under BM25)."""
    return " ".join(str(product["Title"]).lower().split())


def expert_action(engine: WebShopEngine, session: Session) -> str | None:
    """The expert's next action for ``session`` (``None`` once the episode is over)."""
    goal = engine.goal(session.goal_index)
    target = goal["asin"]
    state = session.state
    if state.kind is PageKind.DONE:
        return None
    if state.kind is PageKind.SEARCH:
        return f"search[{search_query(engine.product(target))}]"
    if state.kind is PageKind.RESULTS:
        asins = engine.search(state.keywords)
        if target not in asins:
            return f"click[{BACK_TO_SEARCH}]"
        target_page = asins.index(target) // PRODUCT_WINDOW + 1
        if target_page > state.page:
            return f"click[{NEXT_PAGE}]"
        if target_page < state.page:
            return f"click[{PREV_PAGE}]"
        return f"click[{target.lower()}]"
    if state.kind is PageKind.SUB_PAGE or state.asin != target:
        return f"click[{PREV_PAGE}]"
    for name, value in target_options(engine.product(target), goal).items():
        if state.options.get(name) != value:
            return f"click[{value}]"
    return f"click[{BUY_NOW}]"
