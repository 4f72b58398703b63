"""The site's answers to the attacks of issue 17 (items 7–10): bounded sessions, per-client shares, no 500
from client input, no half-applied actions, and one purchase per session.

Each test reproduces an attack that succeeded before the fix: a 234 KB query kept ~6.4 MiB in its session, 300
anonymous ``GET /`` filled a 300-session site, 5,000-deep JSON and a lone surrogate answered 500 (the latter
after its action was applied), and a finished session accepted a second purchase and showed its thank-you page
at any item URL.
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
from bs4 import BeautifulSoup
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webshop_server.app as app_module
import webshop_server.engine as engine_module
from tests.webshop_server.shop_fixtures import make_tiny_engine
from webshop_server.app import ServerConfig, create_app
from webshop_server.engine import PageKind, Session
from webshop_server.sessions import (
    ClientShareReached,
    MemorySessionStore,
    SessionLimitReached,
    SqliteSessionStore,
)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALICE = {"REMOTE_ADDR": "10.0.0.1"}
BOB = {"REMOTE_ADDR": "10.0.0.2"}
MODES = ("text", "text_rich", "url", "html")
BUY_SOCKS = ["search[cotton socks]", "click[b0sock0001]", "click[navy]", "click[large]", "click[buy now]"]


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request):
    return request.param


def make_client(store_kind, tmp_path, **kwargs):
    if store_kind == "sqlite":
        kwargs["session_db"] = str(tmp_path / f"sessions-{uuid.uuid4().hex}.sqlite")  # fresh per example
    kwargs.setdefault("max_sessions", 1000)
    return create_app(make_tiny_engine(), ServerConfig(**kwargs)).test_client()


@pytest.fixture
def client(store_kind, tmp_path):
    return make_client(store_kind, tmp_path)


def new_session(client, goal_index=0, environ=ALICE):
    reply = client.post(
        "/api/sessions", json={"goal_index": goal_index, "split": "all"}, environ_base=environ
    )
    assert reply.status_code == 201, reply.json
    return reply.json["session_id"]


def step(client, sid, action, mode="text"):
    # json.dumps keeps a lone surrogate as its \ud800 escape, as an HTTP client would send it
    body = json.dumps({"action": action, "mode": mode})
    return client.post(f"/api/sessions/{sid}/step", data=body, content_type="application/json")


def stored(client, sid) -> dict:
    """What the store keeps for ``sid`` (read through the store, as the next request would see it)."""
    with client.application.extensions["webshop"]["store"].use(sid) as session:
        return session.to_dict()


# --- item 7: bounded memory per session ---------------------------------------------------------------------
def test_a_234_kb_query_is_refused_not_stored(client):
    """The attack: ``GET /search_results/<sid>?q=<234 KB of two-letter words>`` kept ~6.4 MiB per session."""
    sid = new_session(client)
    query = " ".join(f"{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(78_000))
    reply = client.get(f"/search_results/{sid}", query_string={"q": query, "page": "1"})
    assert reply.status_code == 400 and "longer than 4096 characters" in reply.get_data(as_text=True)
    assert stored(client, sid)["state"]["kind"] == "search"
    reply = step(client, sid, f"search[{query[:16_000]}]")  # within the action limit, over the query limit
    assert reply.status_code == 400 and "longer than 4096" in reply.json["error"]
    assert stored(client, sid)["state"]["keywords"] == []


@FUZZ
@given(length=st.integers(0, 200), door=st.sampled_from(["site", "api", "buy"]))
def test_stored_query_never_exceeds_the_cap(store_kind, tmp_path, length, door):
    client = make_client(store_kind, tmp_path, max_query_chars=64)
    sid = new_session(client)
    query = ("socks " * 40)[:length]
    if door == "site":
        reply = client.get(f"/search_results/{sid}", query_string={"q": query})
    elif door == "buy":
        reply = client.post(f"/buy/{sid}", data={"asin": "B0SOCK0003", "q": query, "page": "1"})
    else:
        reply = step(client, sid, f"search[{query}]")
    keywords = " ".join(stored(client, sid)["state"]["keywords"])
    if length > 64:
        assert reply.status_code == 400 and keywords == ""
    else:
        assert reply.status_code < 400 and len(keywords) <= 64


def test_a_crawler_walking_item_urls_keeps_only_the_last_visits(client, monkeypatch):
    monkeypatch.setattr(app_module, "MAX_VISITED_PRODUCTS", 3)
    sid = new_session(client)
    asins = [p["asin"] for p in client.application.extensions["webshop"]["engine"].catalog.products]
    for asin in asins:
        assert client.get(f"/item_page/{sid}/{asin}", query_string={"q": "socks"}).status_code == 200
    assert stored(client, sid)["visited_asins"] == asins[-3:]
    assert step(client, sid, "click[back to search]").json["valid"]
    step(client, sid, "search[socks]")
    step(client, sid, "click[b0sock0001]")
    assert stored(client, sid)["visited_asins"] == asins[-2:] + ["B0SOCK0001"]


# --- item 8: a per-client share of the sessions ------------------------------------------------------------
def test_one_client_cannot_fill_the_site(store_kind, tmp_path):
    """300 anonymous ``GET /`` from one address take half of a 300-session site; others still shop."""
    client = make_client(store_kind, tmp_path, max_sessions=300)
    statuses = [client.get("/", environ_base=ALICE).status_code for _ in range(300)]
    assert statuses == [302] * 150 + [429] * 150
    refused = client.get("/", environ_base=ALICE)
    assert refused.headers["Retry-After"] and "its share of the 300" in refused.get_data(as_text=True)
    api = client.post("/api/sessions", json={"goal_index": 0}, environ_base=ALICE)
    assert api.status_code == 429 and "10.0.0.1 already holds 150 open sessions" in api.json["error"]

    # another person still gets a session and finishes an episode by following the site's links
    sid = client.get("/?goal=0&split=all", environ_base=BOB).headers["Location"].rsplit("/", 1)[1]
    page = client.get(f"/search_results/{sid}", query_string={"q": "cotton socks"})
    for selector, text in [
        (".product-link", "b0sock0001"),
        (".option-link", "navy"),
        (".option-link", "large"),
    ]:
        soup = BeautifulSoup(page.get_data(as_text=True), "html.parser")
        page = client.get(
            next(a for a in soup.select(selector) if a.get_text().strip().lower() == text)["href"]
        )
        assert page.status_code == 200
    form = BeautifulSoup(page.get_data(as_text=True), "html.parser").find("form", class_="buy-form")
    done = client.post(form["action"], data={i["name"]: i["value"] for i in form.find_all("input")})
    assert client.get(done.headers["Location"]).status_code == 200
    assert new_session(client, environ=BOB)


def test_share_is_configurable_and_freed_by_close(store_kind, tmp_path):
    client = make_client(store_kind, tmp_path, max_sessions=10, max_sessions_per_client=2)
    first, _ = new_session(client), new_session(client)
    assert client.post("/api/sessions", json={"goal_index": 0}, environ_base=ALICE).status_code == 429
    assert new_session(client, environ=BOB)
    client.delete(f"/api/sessions/{first}")
    assert new_session(client)


def make_store(kind, tmp_path, clock, **kwargs):
    if kind == "memory":
        return MemorySessionStore(clock=clock, **kwargs)
    return SqliteSessionStore(tmp_path / f"store-{uuid.uuid4().hex}.sqlite", clock=clock, **kwargs)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from("abc")),
        st.tuples(st.just("close"), st.integers(0, 20)),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 4.0, 11.0])),
    ),
    max_size=40,
)


@FUZZ
@given(ops=OPS)
def test_store_shares_match_a_model(store_kind, tmp_path, ops):
    """Creates, closes and idle expiry against a plain model: the share and the limit hold at every step."""
    now = [0.0]
    store = make_store(
        store_kind, tmp_path, lambda: now[0], max_sessions=5, idle_timeout_s=10, max_sessions_per_client=2
    )
    model: dict[str, tuple[str, float]] = {}  # sid -> (client, last use)
    ids: list[str] = []
    for op, arg in ops:
        model = {sid: v for sid, v in model.items() if now[0] - v[1] < 10}
        if op == "create":
            held = sum(client == arg for client, _ in model.values())
            if len(model) >= 5:
                with pytest.raises(SessionLimitReached):
                    store.create(lambda sid: Session(sid, 0), client=arg)
            elif held >= 2:
                with pytest.raises(ClientShareReached, match=f"client {arg} already holds 2"):
                    store.create(lambda sid: Session(sid, 0), client=arg)
            else:
                sid = store.create(lambda sid: Session(sid, 0), client=arg)
                model[sid] = (arg, now[0])
                ids.append(sid)
        elif op == "close" and ids:
            sid = ids[arg % len(ids)]
            store.close(sid)
            model.pop(sid, None)
        elif op == "wait":
            now[0] += arg
        assert len(store) == len({sid: v for sid, v in model.items() if now[0] - v[1] < 10})


def test_a_session_file_from_before_the_share_gains_the_client_column(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, data TEXT NOT NULL, version INTEGER NOT NULL, "
            "last_used REAL NOT NULL)"
        )
    store = SqliteSessionStore(path, max_sessions=4, max_sessions_per_client=1)
    store.create(lambda sid: Session(sid, 0), client="a")
    with pytest.raises(ClientShareReached):
        store.create(lambda sid: Session(sid, 0), client="a")
    assert store.create(lambda sid: Session(sid, 0), client="b")


# --- item 9: no 500 from client input, no half-applied action ----------------------------------------------
@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a":', "}")])
@pytest.mark.parametrize("route", ["/api/sessions", "/api/sessions/{sid}/step"])
def test_deeply_nested_json_is_400(client, opener, closer, route):
    body = opener * 5000 + "1" + closer * 5000
    url = route.format(sid=new_session(client))
    reply = client.post(url, data=body, content_type="application/json")
    assert reply.status_code == 400 and "nested too deeply" in reply.json["error"]


def test_the_session_api_reads_bodies_as_the_env_server_does(client):
    """Both servers read a body with progpo_base.http.json_object: a body of more JSON values than a request
    needs is a 413 before it is parsed (the step used to be applied), NaN is not JSON, and the empty body and
    a non-object stay 400s."""
    sid = new_session(client)
    url = f"/api/sessions/{sid}/step"
    before = stored(client, sid)
    padded = json.dumps({"action": "search[shirt]", "pad": [0] * app_module.MAX_JSON_VALUES})
    reply = client.post(url, data=padded, content_type="application/json")
    assert reply.status_code == 413 and "JSON values" in reply.json["error"]
    assert stored(client, sid) == before and step(client, sid, "search[shirt]").status_code == 200
    nan = client.post("/api/sessions", data='{"goal_index": NaN}', content_type="application/json")
    assert nan.status_code == 400 and "NaN is not JSON" in nan.json["error"]
    for body in ("", "[1]"):
        reply = client.post(url, data=body, content_type="application/json")
        assert reply.status_code == 400 and "must be a JSON object" in reply.json["error"]


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` still holds a lone surrogate after a JSON round trip (which joins the valid pairs)."""
    try:
        json.loads(json.dumps(text)).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# text holding lone surrogates (what JSON's unpaired \ud800-\udfff escapes decode to)
SURROGATE_TEXT = st.text(
    alphabet=st.one_of(st.characters(categories=["Cs"]), st.sampled_from("ab shoe[]")),
    min_size=1,
    max_size=12,
).filter(has_lone_surrogate)


@FUZZ
@given(
    before=st.lists(st.sampled_from(["search[socks]", "click[b0sock0001]", "click[navy]"]), max_size=3),
    name=st.sampled_from(["search", "click", "Search", ""]),
    argument=SURROGATE_TEXT,
    mode=st.sampled_from(MODES),
)
def test_lone_surrogates_are_400_and_change_nothing(client, before, name, argument, mode):
    """``search[\\ud800 shoes]`` was applied, then its url/html views and ``/done`` answered 500."""
    sid = new_session(client)
    for action in before:
        step(client, sid, action)
    kept = stored(client, sid)
    reply = step(client, sid, f"{name}[{argument}]", mode)
    assert reply.status_code == 400 and "lone surrogate" in reply.json["error"]
    assert stored(client, sid) == kept
    for m in MODES:
        assert client.get(f"/api/sessions/{sid}/observation", query_string={"mode": m}).status_code == 200
    assert client.get(f"/done/{sid}").status_code < 500


def test_a_step_whose_page_fails_to_render_is_not_applied(store_kind, tmp_path, monkeypatch):
    """Whatever breaks while answering (here: the html renderer), the session stays as it was."""
    client = make_client(store_kind, tmp_path)
    client.application.testing = False  # answer 500 as a server would, instead of raising into the test

    def broken_renderer(engine, session):
        raise RuntimeError("template failure")

    sid = new_session(client)
    kept = stored(client, sid)
    monkeypatch.setattr(engine_module, "render_html", broken_renderer)
    assert step(client, sid, "search[socks]", "html").status_code == 500
    assert stored(client, sid) == kept
    monkeypatch.undo()
    assert step(client, sid, "search[socks]", "html").status_code == 200
    assert stored(client, sid)["state"]["keywords"] == ["socks"]


# --- item 10: one purchase per session ----------------------------------------------------------------------
def bought(client) -> str:
    sid = new_session(client)
    for action in BUY_SOCKS:
        assert step(client, sid, action).status_code == 200
    return sid


def test_a_second_purchase_is_409(client):
    sid = bought(client)
    receipt = stored(client, sid)
    again = client.post(f"/buy/{sid}", data={"asin": "B0SOCK0002", "q": "socks", "page": "1"})
    assert again.status_code == 409 and "already bought B0SOCK0001" in again.get_data(as_text=True)
    api = step(client, sid, " Click[Buy Now] ")
    assert api.status_code == 409 and "already bought B0SOCK0001 (score 1.0)" in api.json["error"]
    assert stored(client, sid) == receipt
    other = step(client, sid, "click[back to search]")  # not a purchase: an invalid action, as in the engine
    assert other.status_code == 200 and other.json["valid"] is False
    page = client.get(f"/done/{sid}")
    assert page.status_code == 200
    assert BeautifulSoup(page.get_data(as_text=True), "html.parser").select_one("#reward pre").text == "1.0"


PAGE_URLS = st.sampled_from(
    [
        "/{sid}",
        "/search_results/{sid}?q={x}&page=1",
        "/search_results/{sid}?q=socks&page=9",
        "/item_page/{sid}/B0SOCK0002?q={x}&page=1",
        "/item_page/{sid}/B0SOCK0001?q=socks&page=1&option:color=black",
        "/item_page/{sid}/B0NOTHERE{x}",
        "/item_sub_page/{sid}/B0TEA00001/Reviews?q={x}",
        "/item_sub_page/{sid}/B0SOCK0001/Features?option:size={x}",
    ]
)


@FUZZ
@given(url=PAGE_URLS, x=st.text(alphabet="abcxyz019", max_size=8))
def test_pages_of_a_finished_session_redirect_to_its_done_page(client, url, x):
    """Any item URL after the purchase showed the thank-you page with 200 (under the item's URL)."""
    sid = bought(client)
    reply = client.get(url.format(sid=sid, x=x))
    assert reply.status_code == 303 and reply.headers["Location"].endswith(f"/done/{sid}")
    assert stored(client, sid)["state"]["kind"] == PageKind.DONE.value
