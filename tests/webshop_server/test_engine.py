"""The page engine: pages, actions, observation modes and rewards (on the hand-written tiny catalog)."""

from __future__ import annotations

import types

import pytest

from progpo_envs.webshop.browser import html_available_actions, html_to_text
from tests.webshop_server.shop_fixtures import PRODUCTS, WordOverlapIndex, make_tiny_catalog
from webshop_server.engine import (
    PRODUCT_WINDOW,
    ObservationMode,
    PageKind,
    WebShopEngine,
    parse_action,
    split_range,
)


def walk(engine, session, actions):
    for action in actions:
        outcome = engine.step(session, action)
        assert outcome.valid, (action, outcome.message)
    return outcome


def every_page(engine):
    """Sessions standing on every kind of page (search, results p1/p2, item with options, sub-pages, done)."""
    pages = []
    s = engine.new_session(0)
    pages.append(s)
    s = engine.new_session(0)
    walk(engine, s, ["search[socks cotton]"])
    pages.append(s)
    s = engine.new_session(0)
    walk(engine, s, ["search[socks]", "click[b0sock0001]", "click[navy]"])
    pages.append(s)
    for sub in ("description", "features", "reviews"):
        s = engine.new_session(0)
        walk(engine, s, ["search[socks]", "click[b0sock0001]", f"click[{sub}]"])
        pages.append(s)
    s = engine.new_session(0)
    walk(engine, s, ["search[socks]", "click[b0sock0001]", "click[navy]", "click[buy now]"])
    pages.append(s)
    return pages


def test_text_mode_is_the_visible_text_of_the_html(tiny_engine):
    for session in every_page(tiny_engine):
        html = tiny_engine.observation(session, ObservationMode.HTML)
        text = tiny_engine.observation(session, ObservationMode.TEXT)
        assert text == html_to_text(html), session.state.kind
        assert tiny_engine.available_actions(session) == html_available_actions(html), session.state.kind


def test_search_page_text_matches_upstream_shape(tiny_engine):
    session = tiny_engine.new_session(1)
    text = tiny_engine.observation(session, "text")
    assert (
        text
        == "WebShop [SEP] Instruction: [SEP] " + tiny_engine.goal(1)["instruction_text"] + " [SEP] Search"
    )
    assert tiny_engine.available_actions(session) == {"has_search_bar": True, "clickables": ["search"]}


def test_goal_never_shown(tiny_engine):
    goal = tiny_engine.goal(0)
    for session in every_page(tiny_engine):
        for mode in ObservationMode:
            obs = tiny_engine.observation(session, mode)
            assert "price_upper" not in obs and "goal_options" not in obs and "weight" not in obs
        if session.state.kind is PageKind.SEARCH:
            assert goal["asin"] not in tiny_engine.observation(session, ObservationMode.HTML)


def test_text_rich_marks_clicked_options_and_visited_products(tiny_engine):
    session = tiny_engine.new_session(0)
    walk(tiny_engine, session, ["search[socks]", "click[b0sock0001]", "click[navy]"])
    rich = tiny_engine.observation(session, ObservationMode.TEXT_RICH)
    assert rich.startswith("You have clicked navy.\n")
    assert "[clicked button] navy [clicked button_]" in rich and "[button] black [button_]" in rich
    assert "[button] Buy Now [button_]" in rich
    walk(tiny_engine, session, ["click[< prev]"])
    rich = tiny_engine.observation(session, ObservationMode.TEXT_RICH)
    assert "[clicked button] B0SOCK0001 [clicked button_]" in rich
    assert "[button] B0SOCK0002 [button_]" in rich


def test_url_mode_round_trips_the_state(tiny_engine):
    session = tiny_engine.new_session(0)
    walk(tiny_engine, session, ["search[cotton socks]", "click[b0sock0001]", "click[large]"])
    url = tiny_engine.observation(session, ObservationMode.URL, base_url="http://shop")
    assert url == "http://shop/item_page/fixed_0/B0SOCK0001?q=cotton+socks&page=1&option%3Asize=large"


def test_navigation_routes(tiny_engine):
    s = tiny_engine.new_session(0)
    walk(tiny_engine, s, ["search[socks]", "click[b0sock0002]", "click[features]"])
    assert s.state.kind is PageKind.SUB_PAGE
    assert "wool for comfort" in tiny_engine.observation(s)
    walk(tiny_engine, s, ["click[< prev]"])
    assert s.state.kind is PageKind.ITEM and s.state.asin == "B0SOCK0002"
    walk(tiny_engine, s, ["click[< prev]"])
    assert s.state.kind is PageKind.RESULTS and s.state.keywords == ("socks",)
    walk(tiny_engine, s, ["click[back to search]"])
    assert s.state.kind is PageKind.SEARCH


@pytest.mark.parametrize(
    "action",
    [
        "",
        "click",
        "click[]",
        "search[]",
        "search[   ]",
        "click[search]",
        "click[nonexistent]",
        "buy now",
        "click[next >]",
        "click[< prev]",
        "click[b0sock0001]",
        "search",
        "[search]",
        "search[x",
        "\x00",
        "😀[😀]",
    ],
)
def test_invalid_actions_change_nothing(tiny_engine, action):
    session = tiny_engine.new_session(0)
    before = (tiny_engine.observation(session, "html"), tiny_engine.available_actions(session))
    outcome = tiny_engine.step(session, action)
    assert not outcome.valid and outcome.message
    assert (tiny_engine.observation(session, "html"), tiny_engine.available_actions(session)) == before


def test_search_only_from_a_search_bar_unless_configured(tiny_engine):
    s = tiny_engine.new_session(0)
    walk(tiny_engine, s, ["search[socks]"])
    assert not tiny_engine.step(s, "search[tea]").valid
    lenient = WebShopEngine(
        tiny_engine.catalog, tiny_engine.index, config=type(tiny_engine.config)(search_from_any_page=True)
    )
    s = lenient.new_session(0)
    walk(lenient, s, ["search[socks]", "search[tea]"])
    assert s.state.keywords == ("tea",)


def test_action_parsing_is_lenient_on_case_and_space():
    assert parse_action("  CLICK[Buy Now]") == ("click", "Buy Now")
    assert parse_action("search[a [b] c]") == ("search", "a [b] c")


def test_right_options_score_one_wrong_lower_random_much_lower(tiny_engine):
    right = walk(
        tiny_engine,
        tiny_engine.new_session(0),
        ["search[socks]", "click[b0sock0001]", "click[navy]", "click[large]", "click[buy now]"],
    )
    wrong = walk(
        tiny_engine,
        tiny_engine.new_session(0),
        ["search[socks]", "click[b0sock0001]", "click[black]", "click[small]", "click[buy now]"],
    )
    other = walk(
        tiny_engine, tiny_engine.new_session(0), ["search[lamp]", "click[b0lamp0001]", "click[buy now]"]
    )
    assert right.done and right.score == 1.0
    assert 0 < wrong.score < right.score
    assert other.score < wrong.score


def test_done_session_accepts_nothing(tiny_engine):
    s = tiny_engine.new_session(3)
    walk(tiny_engine, s, ["search[bamboo]", "click[b0sock0003]", "click[buy now]"])
    assert s.done and tiny_engine.available_actions(s) == {"has_search_bar": False, "clickables": []}
    assert not tiny_engine.step(s, "click[back to search]").valid
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0" in tiny_engine.observation(s)


def test_pagination_ten_per_page_top_fifty():
    products = [dict(PRODUCTS[2], asin=f"B0PAGE{i:04d}", Title=f"Sock number {i}") for i in range(60)]
    catalog = types.SimpleNamespace(
        products=products,
        product_by_asin={p["asin"]: p for p in products},
        product_prices={p["asin"]: 9.99 for p in products},
        goals=make_tiny_catalog().goals,
        fingerprint="pages",
    )
    engine = WebShopEngine(catalog, WordOverlapIndex(products))
    s = engine.new_session(0)
    walk(engine, s, ["search[sock]"])
    assert "Page 1 (Total results: 50)" in engine.observation(s)
    assert "< prev" not in engine.available_actions(s)["clickables"]
    for page in range(2, 6):
        walk(engine, s, ["click[next >]"])
        clickables = engine.available_actions(s)["clickables"]
        assert f"Page {page} (Total results: 50)" in engine.observation(s)
        assert sum(c.startswith("b0page") for c in clickables) == PRODUCT_WINDOW
    assert "next >" not in engine.available_actions(s)["clickables"]  # the top 50 end on page 5
    walk(engine, s, ["click[< prev]", "click[b0page0035]", "click[< prev]"])
    assert s.state.kind is PageKind.RESULTS and s.state.page == 4


def test_split_boundaries():
    assert split_range("test", 12087) == range(0, 500) and split_range("train", 12087) == range(500, 12087)
    assert split_range("test", 1000) == range(0, 500) and split_range("train", 1000) == range(500, 1000)
    for n in (2, 3, 10, 999):
        test, train = split_range("test", n), split_range("train", n)
        assert len(test) >= 1 and len(train) >= 1 and test.stop == train.start and train.stop == n
    assert split_range("all", 7) == range(7)


def test_engine_pickles_for_subprocess_workers(tiny_engine):
    import pickle

    copy = pickle.loads(pickle.dumps(tiny_engine))
    s = copy.new_session(0)
    walk(copy, s, ["search[socks]", "click[b0sock0001]"])
    assert s.state.asin == "B0SOCK0001"
