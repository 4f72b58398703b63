"""The Flask app (test client): the JSON session API, the human site, limits, and fuzzing of every route."""

from __future__ import annotations

import json
import re

import pytest
from bs4 import BeautifulSoup
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webshop_server.shop_fixtures import make_tiny_engine
from webshop_server.app import ServerConfig, create_app
from webshop_server.engine import Session
from webshop_server.sessions import (
    MemorySessionStore,
    SessionBusy,
    SessionLimitReached,
    SqliteSessionStore,
    UnknownSession,
)


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request):
    return request.param


def config_for(store_kind, tmp_path, **kwargs):
    if store_kind == "sqlite":
        kwargs["session_db"] = str(tmp_path / f"sessions-{len(list(tmp_path.iterdir()))}.sqlite")
    return ServerConfig(**kwargs)


@pytest.fixture
def app(store_kind, tmp_path):
    return create_app(
        make_tiny_engine(), config_for(store_kind, tmp_path, max_sessions=1000, idle_timeout_s=600)
    )


@pytest.fixture
def client(app):
    return app.test_client()


def new_session(client, goal_index=0, split="all"):
    reply = client.post("/api/sessions", json={"goal_index": goal_index, "split": split})
    assert reply.status_code == 201, reply.json
    return reply.json["session_id"]


def test_api_episode(client):
    info = client.get("/api/info").json
    assert info["num_goals"] == 4 and info["splits"] == {"test": 2, "train": 2, "all": 4}
    sid = new_session(client, 0)
    assert len(sid) >= 20
    obs = client.get(f"/api/sessions/{sid}/observation").json
    assert obs["observation"].startswith("WebShop [SEP] Instruction:") and obs["done"] is False
    for action in ["search[cotton socks]", "click[b0sock0001]", "click[navy]", "click[large]"]:
        reply = client.post(f"/api/sessions/{sid}/step", json={"action": action}).json
        assert reply["valid"] and not reply["done"]
    reply = client.post(
        f"/api/sessions/{sid}/step", json={"action": "click[buy now]", "mode": "text_rich"}
    ).json
    assert reply["done"] and reply["score"] == 1.0 and "Thank you for shopping" in reply["observation"]
    assert client.get(f"/api/sessions/{sid}/available_actions").json == {
        "has_search_bar": False,
        "clickables": [],
    }
    assert client.delete(f"/api/sessions/{sid}").json == {"closed": True}
    assert client.get(f"/api/sessions/{sid}/observation").status_code == 404


def test_split_relative_goal_index(client):
    sid = new_session(client, 0, split="train")
    assert "desk lamp" in client.get(f"/api/sessions/{sid}/observation").json["observation"]


@pytest.mark.parametrize(
    "method,path,body,status",
    [
        ("post", "/api/sessions", None, 400),
        ("post", "/api/sessions", [1, 2], 400),
        ("post", "/api/sessions", {"goal_index": "0"}, 400),
        ("post", "/api/sessions", {"goal_index": True}, 400),
        ("post", "/api/sessions", {"goal_index": 99}, 400),
        ("post", "/api/sessions", {"goal_index": 0, "split": "dev"}, 400),
        ("get", "/api/sessions/nope/observation", None, 404),
        ("post", "/api/sessions/nope/step", {"action": "x"}, 404),
        ("delete", "/api/sessions/nope", None, 404),
        ("get", "/api/nothing", None, 404),
        ("put", "/api/sessions", None, 405),
    ],
)
def test_malformed_requests_are_4xx_with_a_message(client, method, path, body, status):
    reply = getattr(client, method)(path, json=body) if body is not None else getattr(client, method)(path)
    assert reply.status_code == status
    assert reply.json["error"]


def test_bad_step_bodies(client):
    sid = new_session(client)
    for body in [
        {"action": 3},
        {"action": None},
        {},
        {"action": "x", "mode": "pdf"},
        {"action": "x" * 20_000},
    ]:
        reply = client.post(f"/api/sessions/{sid}/step", json=body)
        assert reply.status_code == 400 and reply.json["error"]
    reply = client.post(f"/api/sessions/{sid}/step", data="{not json", content_type="application/json")
    assert reply.status_code == 400
    huge = client.post(f"/api/sessions/{sid}/step", data="x" * (2 << 20), content_type="application/json")
    assert huge.status_code == 413


def test_expert_endpoint_off_by_default(client):
    sid = new_session(client)
    assert client.get(f"/api/sessions/{sid}/expert_action").status_code == 403
    app = create_app(make_tiny_engine(), ServerConfig(expose_expert=True))  # in-memory sessions
    c = app.test_client()
    sid = new_session(c)
    assert c.get(f"/api/sessions/{sid}/expert_action").json["action"].startswith("search[")


def test_session_limit_answers_503(store_kind, tmp_path):
    # one client may fill this table (the per-client share is tested in test_hardening.py)
    config = config_for(store_kind, tmp_path, max_sessions=3, max_sessions_per_client=3)
    client = create_app(make_tiny_engine(), config).test_client()
    sids = [new_session(client) for _ in range(3)]
    reply = client.post("/api/sessions", json={"goal_index": 0})
    assert reply.status_code == 503 and "limit" in reply.json["error"] and reply.headers["Retry-After"]
    client.delete(f"/api/sessions/{sids[0]}")
    assert client.post("/api/sessions", json={"goal_index": 0}).status_code == 201


def make_store(kind, tmp_path, clock, **kwargs):
    if kind == "memory":
        return MemorySessionStore(clock=clock, **kwargs)
    return SqliteSessionStore(tmp_path / "store.sqlite", clock=clock, **kwargs)


def test_idle_sessions_expire(store_kind, tmp_path):
    now = [0.0]
    store = make_store(store_kind, tmp_path, lambda: now[0], max_sessions=2, idle_timeout_s=10)
    a = store.create(lambda sid: Session(sid, 0))
    now[0] = 5
    b = store.create(lambda sid: Session(sid, 1))
    now[0] = 12  # a idle 12 s, b idle 7 s
    with pytest.raises(UnknownSession):
        with store.use(a):
            pass
    with store.use(b) as session:
        assert session.goal_index == 1
    store.create(lambda sid: Session(sid, 2))
    assert len(store) == 2
    with pytest.raises(SessionLimitReached):
        store.create(lambda sid: Session(sid, 3))
    now[0] = 100
    assert len(store) == 0


def test_session_changes_persist_and_survive_a_second_process_view(tmp_path):
    """Two stores on one SQLite file (as two gunicorn workers): each sees the other's changes."""
    engine = make_tiny_engine()
    first, second = (SqliteSessionStore(tmp_path / "shared.sqlite") for _ in range(2))
    sid = first.create(lambda s: engine.new_session(0, session_id=s))
    with first.use(sid) as session:
        engine.step(session, "search[socks]")
    with second.use(sid) as session:
        assert session.state.keywords == ("socks",)
        engine.step(session, "click[b0sock0001]")
    with first.use(sid) as session:
        assert session.state.asin == "B0SOCK0001" and session.visited_asins == ["B0SOCK0001"]
    with pytest.raises(SessionBusy):  # a step that races another step on the same session loses cleanly
        with first.use(sid) as session:
            with second.use(sid) as other:
                engine.step(other, "click[navy]")
            engine.step(session, "click[black]")
    with second.use(sid) as session:
        assert session.state.options == {"color": "navy"}


def test_session_round_trips_through_a_dict(tiny_engine):
    session = tiny_engine.new_session(0, session_id="abc")
    for action in ["search[socks]", "click[b0sock0001]", "click[navy]", "click[features]"]:
        tiny_engine.step(session, action)
    assert Session.from_dict(json.loads(json.dumps(session.to_dict()))) == session
    tiny_engine.step(session, "click[< prev]")
    tiny_engine.step(session, "click[buy now]")
    assert Session.from_dict(json.loads(json.dumps(session.to_dict()))) == session


def test_goal_is_never_served(client):
    goal = client.application.extensions["webshop"]["engine"].goal(0)
    sid = new_session(client, 0)
    texts = [
        client.get(f"/api/sessions/{sid}/observation?mode={m}").get_data(as_text=True)
        for m in ("text", "html", "text_rich", "url")
    ]
    texts.append(client.get(f"/{sid}").get_data(as_text=True))
    for text in texts:
        assert goal["asin"] not in text and "price_upper" not in text and "goal_options" not in text


def test_human_site_episode_by_following_links(client):
    """A person's clicks: follow the rendered links and submit the forms (what a browser does)."""
    start = client.get("/?goal=0&split=all")
    assert start.status_code == 302
    page = client.get(start.headers["Location"])
    soup = BeautifulSoup(page.get_data(as_text=True), "html.parser")
    form = soup.find("form", class_="search-form")
    page = client.get(form["action"], query_string={"q": "cotton socks", "page": "1"})
    assert "Page 1 (Total results:" in page.get_data(as_text=True)

    def follow(page, selector, text):
        soup = BeautifulSoup(page.get_data(as_text=True), "html.parser")
        link = next(a for a in soup.select(selector) if a.get_text().strip().lower() == text)
        reply = client.get(link["href"])
        assert reply.status_code == 200, reply.get_data(as_text=True)
        return reply

    page = follow(page, ".product-link", "b0sock0001")
    page = follow(page, ".option-link", "navy")
    page = follow(page, ".option-link", "large")
    page = follow(page, ".btn", "features")
    page = follow(page, ".btn", "< prev")
    soup = BeautifulSoup(page.get_data(as_text=True), "html.parser")
    assert soup.select_one("input[name=color][checked]")["value"] == "navy"
    form = soup.find("form", class_="buy-form")
    fields = {i["name"]: i["value"] for i in form.find_all("input")}
    done = client.post(form["action"], data=fields)
    assert done.status_code == 303
    page = client.get(done.headers["Location"])
    assert BeautifulSoup(page.get_data(as_text=True), "html.parser").select_one("#reward pre").text == "1.0"


def test_human_site_rejects_impossible_pages(client):
    sid = new_session(client)
    assert client.get(f"/item_page/{sid}/B0NOTHERE1?q=socks&page=1").status_code == 404
    assert client.get(f"/item_page/{sid}/B0SOCK0001?q=socks&page=1&option:color=pink").status_code == 404
    assert client.get(f"/item_sub_page/{sid}/B0SOCK0001/Attributes?q=socks").status_code == 404
    assert client.get(f"/search_results/{sid}?q=socks&page=x").status_code == 400
    assert client.get(f"/search_results/{sid}?q=socks&page=9").status_code == 404
    assert client.get("/static/style.css").status_code == 200


# --- fuzzing ------------------------------------------------------------------------------------------------
ACTIONS = st.one_of(
    st.text(max_size=200),
    st.builds(
        lambda n, a: f"{n}[{a}]",
        st.sampled_from(["search", "click", "Click", "buy", ""]),
        st.text(max_size=80),
    ),
    st.sampled_from(
        [
            "click[back to search]",
            "click[next >]",
            "click[< prev]",
            "click[buy now]",
            "click[navy]",
            "click[b0sock0001]",
            "click[description]",
            "search[socks]",
            "search[tea]",
        ]
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(ACTIONS, max_size=12))
def test_fuzz_actions_no_500_no_leak(client, actions):
    a, b = new_session(client, 0), new_session(client, 1)
    instruction_b = client.get(f"/api/sessions/{b}/observation").json["observation"]
    done = False
    for action in actions:
        reply = client.post(f"/api/sessions/{a}/step", json={"action": action, "mode": "html"})
        if done and action == "click[buy now]":  # a session buys once
            assert reply.status_code == 409 and "already bought" in reply.json["error"]
            continue
        assert reply.status_code == 200
        done = done or reply.json["done"]
        body = reply.get_data(as_text=True)
        assert b not in body and "organic green tea" not in body  # b's id and goal never reach a
    assert client.get(f"/api/sessions/{b}/observation").json["observation"] == instruction_b
    client.delete(f"/api/sessions/{a}")
    client.delete(f"/api/sessions/{b}")


PATHS = st.sampled_from(
    [
        "/",
        "/{sid}",
        "/search_results/{sid}",
        "/item_page/{sid}/{x}",
        "/item_sub_page/{sid}/{x}/{x}",
        "/item_sub_page/{sid}/B0SOCK0001/Features",
        "/item_page/{sid}/B0SOCK0001",
        "/buy/{sid}",
        "/done/{sid}",
        "/api/health",
        "/api/info",
        "/api/sessions",
        "/api/sessions/{sid}/observation",
        "/api/sessions/{sid}/step",
        "/api/sessions/{sid}/available_actions",
        "/api/sessions/{sid}/expert_action",
        "/api/sessions/{sid}",
        "/{x}",
        "/static/{x}",
    ]
)
SAFE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/?#"), max_size=30
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    path=PATHS,
    x=SAFE_TEXT,
    use_real_sid=st.booleans(),
    query=st.dictionaries(
        st.sampled_from(["q", "page", "option:color", "mode", "goal", "split", "asin"]), SAFE_TEXT
    ),
    body=st.one_of(
        st.none(),
        st.text(max_size=50),
        st.dictionaries(
            st.text(max_size=10),
            st.one_of(st.integers(), st.text(max_size=20), st.booleans(), st.none()),
            max_size=4,
        ),
    ),
)
def test_fuzz_every_route_never_500(client, method, path, x, use_real_sid, query, body):
    sid = new_session(client) if use_real_sid else x
    url = path.format(sid=sid, x=x)
    kwargs = {"query_string": query}
    if isinstance(body, dict):
        kwargs["json"] = body
    elif body is not None:
        kwargs["data"] = body
    reply = client.open(url, method=method, **kwargs)
    assert reply.status_code < 500, (url, reply.get_data(as_text=True)[:300])
    if reply.status_code >= 400 and url.startswith("/api/"):
        assert json.loads(reply.get_data(as_text=True))["error"]
    if use_real_sid:
        client.delete(f"/api/sessions/{sid}")


def test_session_ids_are_unguessable(client):
    ids = {new_session(client) for _ in range(20)}
    assert len(ids) == 20 and all(re.fullmatch(r"[A-Za-z0-9_-]{20,}", i) for i in ids)
