"""The WebShop web server: the human site and a JSON session API for agents, over one shared page engine.

One catalog, one search index and one :class:`~webshop_server.engine.WebShopEngine` per process serve every
session. Sessions are kept in a bounded :class:`~webshop_server.sessions.SessionStore` (unguessable ids, idle
expiry; a full table answers 503, and a client holding its share of the table answers 429; a client is its
host, or its client token with ``client_tokens``: :mod:`webshop_server.clients`; an unknown token answers
401).
What a session keeps is bounded too: search queries longer than ``max_query_chars`` are refused with 400, and
only the last :data:`MAX_VISITED_PRODUCTS` opened products are remembered. A request that fails changes
nothing in its session.

Human site (plain HTML and one local stylesheet; no JavaScript, no CDN; options are links, so they work in any
browser, headless or not):

* ``GET /``: a new session (``?goal=i&split=test|train|all``, else a random train goal), redirected to
  its search page ``GET /<sid>``;
* ``GET /search_results/<sid>?q=...&page=p``: results (10 per page of the top 50);
* ``GET /item_page/<sid>/<asin>?q=...&page=p&option:<name>=<value>...``: an item with the chosen options;
* ``GET /item_sub_page/<sid>/<asin>/<Description|Features|Reviews>?...``: its sub-pages;
* ``POST /buy/<sid>`` (form fields asin, q, page, option:<name>): Buy Now; redirects to ``GET /done/<sid>``.
  A finished session refuses a second purchase with 409, and every page URL of it redirects (303) to its done
  page (as a shop shows the order confirmation, not the product, once you have checked out).

JSON API (every error is a 4xx or 503 JSON ``{"error": message}``; the goal is never sent):

* ``GET /api/health`` -> ``{"status": "ok", "sessions": n}``;
* ``GET /api/info`` -> goal counts per split, catalog fingerprint, observation modes;
* ``POST /api/sessions`` ``{"goal_index": i, "split": "test"}`` -> 201
  ``{"session_id", "goal_index", "instruction"}`` (``goal_index`` in the reply is absolute);
* ``GET /api/sessions/<sid>/observation?mode=text`` -> ``{"observation", "available_actions", "done"}``;
* ``GET /api/sessions/<sid>/available_actions`` -> ``{"has_search_bar", "clickables"}``;
* ``POST /api/sessions/<sid>/step`` ``{"action": "...", "mode": "text"}`` -> ``{"observation",
  "available_actions", "valid", "score", "done", "message"}``; ``click[buy now]`` on a finished session is
  409 (other actions there are invalid actions, as in the engine); an action that is not UTF-8 text (a lone
  UTF-16 surrogate, which a JSON escape can encode) is 400;
* ``GET /api/sessions/<sid>/expert_action`` -> ``{"action"}``, only with ``expose_expert`` (tests, demos);
* ``DELETE /api/sessions/<sid>`` -> ``{"closed": true}``.

Example:
    >>> from webshop_server.app import create_app  # doctest: +SKIP
    >>> client = create_app(engine).test_client()  # doctest: +SKIP
    >>> reply = client.post("/api/sessions", json={"goal_index": 0, "split": "test"})  # doctest: +SKIP
    >>> sid = reply.json["session_id"]  # doctest: +SKIP
    >>> client.post(f"/api/sessions/{sid}/step", json={"action": "search[x]"}).json["valid"]  # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, jsonify, redirect, request
from werkzeug.exceptions import HTTPException

from progpo_base.http import RequestError, json_object
from webshop_server.clients import ClientTokens, UnknownClientToken, identify_client
from webshop_server.engine import (
    BUY_NOW,
    ObservationMode,
    PageKind,
    PageState,
    Session,
    Split,
    SubPage,
    WebShopEngine,
    page_url,
    parse_action,
    render_html,
    split_range,
)
from webshop_server.expert import expert_action
from webshop_server.sessions import (
    ClientShareReached,
    MemorySessionStore,
    SessionBusy,
    SessionLimitReached,
    SessionStore,
    SqliteSessionStore,
    UnknownSession,
)

#: Longest action string the API accepts (longer ones get 400; the env caps actions at 4096 characters).
MAX_ACTION_CHARS = 16_384
#: Most JSON values in a session API request body (a create or a step holds a handful; more answers 413).
MAX_JSON_VALUES = 1 << 14
#: Products a session remembers as opened (``text_rich`` marks them clicked): the most recent ones, so that a
#: crawler walking every item URL of one session cannot grow it without bound.
MAX_VISITED_PRODUCTS = 500


@dataclasses.dataclass
class ServerConfig:
    """Server settings.

    Attributes:
        max_sessions: Sessions alive at once (a full table answers 503).
        max_sessions_per_client: Sessions one client (a host, or a client token) may hold at once; past it,
            its creates answer 429 while other clients still get sessions. ``None``: half of
            ``max_sessions``, so no one client can fill the table. Behind a reverse proxy every client has the
            proxy's address: give clients tokens, or set it to ``max_sessions`` there.
        idle_timeout_s: Seconds after which an unused session expires.
        expose_expert: Serve ``/api/sessions/<sid>/expert_action`` (it reads the goal).
        max_request_bytes: Largest request body.
        max_query_chars: Longest search query a session keeps (site ``q=`` and ``search[...]``); longer ones
            answer 400. The default admits every query the env's 4096-character actions can carry.
        session_db: A SQLite file holding the sessions, so that several server processes share them
            (:class:`~webshop_server.sessions.SqliteSessionStore`); ``None`` keeps them in this process.
        client_tokens: The operator's client tokens (``--client-tokens``; ``None``: every client is its host).
    """

    max_sessions: int = 10_000
    max_sessions_per_client: int | None = None
    idle_timeout_s: float = 1800.0
    expose_expert: bool = False
    max_request_bytes: int = 1 << 20
    max_query_chars: int = 4096
    session_db: str | None = None
    client_tokens: ClientTokens | None = None

    def client_share(self) -> int:
        """The sessions one client may hold (``max_sessions_per_client``, or half the table)."""
        if self.max_sessions_per_client is None:
            return max(1, self.max_sessions // 2)
        return self.max_sessions_per_client


def create_app(engine: WebShopEngine, config: ServerConfig | None = None) -> Flask:
    """The Flask app over ``engine`` (one engine per process, shared by every session)."""
    config = config or ServerConfig()
    app = Flask(__name__, static_folder=str(Path(__file__).parent / "static"), static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    share = config.client_share()
    store: SessionStore = (
        SqliteSessionStore(
            config.session_db, config.max_sessions, config.idle_timeout_s, max_sessions_per_client=share
        )
        if config.session_db
        else MemorySessionStore(config.max_sessions, config.idle_timeout_s, max_sessions_per_client=share)
    )
    app.extensions["webshop"] = {"engine": engine, "store": store, "config": config}

    def is_api() -> bool:
        return request.path.startswith("/api/")

    @app.errorhandler(RequestError)
    def api_error(exc: RequestError):
        if is_api():
            return jsonify(error=exc.message), exc.status
        return _html_error(exc.status, exc.message)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        message = exc.description or exc.name
        if is_api():
            return jsonify(error=message), exc.code
        return _html_error(exc.code or 400, message)

    @app.errorhandler(SessionLimitReached)  # 503: the server is full
    @app.errorhandler(ClientShareReached)  # 429: this client holds its share
    def try_again_later(exc: SessionLimitReached | ClientShareReached):
        status = 429 if isinstance(exc, ClientShareReached) else 503
        response = jsonify(error=str(exc)) if is_api() else _html_error(status, str(exc))
        response.status_code = status
        response.headers["Retry-After"] = "30"
        return response

    @app.errorhandler(UnknownSession)
    def unknown(exc: UnknownSession):
        return api_error(RequestError(404, "unknown or expired session"))

    @app.errorhandler(SessionBusy)
    def busy(exc: SessionBusy):
        return api_error(RequestError(409, str(exc)))

    @app.before_request
    def identify_and_read():
        try:
            g.client = identify_client(
                config.client_tokens, request.headers.get("Authorization"), request.remote_addr
            )
        except UnknownClientToken as exc:
            raise RequestError(401, str(exc)) from None
        try:  # read the body here, once: a body the server cannot read is the client's fault
            request.get_data(cache=True, parse_form_data=True)
        except HTTPException:
            raise  # 413 past max_request_bytes
        except Exception as exc:  # noqa: BLE001 - the WSGI server's own parse errors (gunicorn's
            # InvalidChunkSize is a plain Exception), a client that hung up: all about the client's bytes
            raise RequestError(400, f"the request body could not be read ({type(exc).__name__})") from None

    def new_session(goal_index: int) -> str:
        return store.create(lambda sid: engine.new_session(goal_index, session_id=sid), client=g.client)

    def goal_from(split_value: Any, index_value: Any) -> int:
        try:
            split = Split(split_value)
        except ValueError:
            raise RequestError(
                400, f"split must be one of {[s.value for s in Split]}, got {split_value!r}"
            ) from None
        if isinstance(index_value, bool) or not isinstance(index_value, int):
            raise RequestError(400, "goal_index must be an integer")
        goals = split_range(split, engine.num_goals)
        if not 0 <= index_value < len(goals):
            raise RequestError(
                400, f"goal_index {index_value} out of range: split {split.value!r} has {len(goals)} goals"
            )
        return goals[index_value]

    def mode_from(value: Any) -> ObservationMode:
        try:
            return ObservationMode(value)
        except ValueError:
            raise RequestError(400, f"mode must be one of {[m.value for m in ObservationMode]}") from None

    def observe(session: Session, mode: ObservationMode) -> str:
        return engine.observation(session, mode, base_url=request.host_url.rstrip("/"))

    def json_body() -> dict:
        raw = request.get_data(cache=True)  # read once, in identify_and_read
        if not raw:
            raise RequestError(400, "the request body must be a JSON object")
        return json_object(raw, MAX_JSON_VALUES)

    def keywords_and_page(args: Any) -> tuple[tuple[str, ...], int]:
        return _keywords_and_page(args, config.max_query_chars)

    def finished(session: Session) -> RequestError:
        asin = session.purchased[0] if session.purchased else "?"
        return RequestError(
            409,
            f"this session is finished: it already bought {asin} (score {session.score}); a session buys "
            f"once (its receipt: /done/{session.session_id}; start a new session for another purchase)",
        )

    # --- JSON API -------------------------------------------------------------------------------------------
    @app.get("/api/health")
    def health():
        return jsonify(status="ok", sessions=len(store))

    @app.get("/api/info")
    def info():
        return jsonify(
            num_goals=engine.num_goals,
            fingerprint=str(engine.catalog.fingerprint),
            num_products=len(engine.catalog.products),
            splits={s.value: len(split_range(s, engine.num_goals)) for s in Split},
            observation_modes=[m.value for m in ObservationMode],
        )

    @app.post("/api/sessions")
    def create_session():
        body = json_body()
        goal_index = goal_from(body.get("split", Split.ALL.value), body.get("goal_index"))
        session_id = new_session(goal_index)
        instruction = str(engine.goal(goal_index)["instruction_text"])
        return jsonify(session_id=session_id, goal_index=goal_index, instruction=instruction), 201

    @app.get("/api/sessions/<session_id>/observation")
    def observation(session_id: str):
        mode = mode_from(request.args.get("mode", ObservationMode.TEXT.value))
        with store.use(session_id) as session:
            return jsonify(
                observation=observe(session, mode),
                available_actions=engine.available_actions(session),
                done=session.done,
            )

    @app.get("/api/sessions/<session_id>/available_actions")
    def available_actions(session_id: str):
        with store.use(session_id) as session:
            return jsonify(engine.available_actions(session))

    @app.post("/api/sessions/<session_id>/step")
    def step(session_id: str):
        body = json_body()
        action = body.get("action")
        if not isinstance(action, str):
            raise RequestError(400, "action must be a string")
        if len(action) > MAX_ACTION_CHARS:
            raise RequestError(400, f"action longer than {MAX_ACTION_CHARS} characters")
        _require_utf8("action", action)
        name, argument = parse_action(action)
        if name == "search" and argument is not None and len(argument) > config.max_query_chars:
            raise RequestError(400, f"the search query is longer than {config.max_query_chars} characters")
        mode = mode_from(body.get("mode", ObservationMode.TEXT.value))
        with store.use(session_id) as session:
            if session.done and name == "click" and (argument or "").strip().lower() == BUY_NOW:
                raise finished(session)
            outcome = engine.step(session, action)
            _forget_old_visits(session)
            return jsonify(
                observation=observe(session, mode),
                available_actions=engine.available_actions(session),
                valid=outcome.valid,
                score=outcome.score,
                done=outcome.done,
                message=outcome.message,
            )

    @app.get("/api/sessions/<session_id>/expert_action")
    def expert(session_id: str):
        if not config.expose_expert:
            raise RequestError(403, "the expert is disabled on this server (start it with --expose-expert)")
        with store.use(session_id) as session:
            return jsonify(action=expert_action(engine, session))

    @app.delete("/api/sessions/<session_id>")
    def close(session_id: str):
        if not store.close(session_id):
            raise RequestError(404, "unknown or expired session")
        return jsonify(closed=True)

    # --- human site -----------------------------------------------------------------------------------------
    @app.get("/")
    def start():
        if "goal" in request.args:
            try:
                goal_index = int(request.args["goal"])
            except ValueError:
                raise RequestError(400, "goal must be an integer") from None
            goal_index = goal_from(request.args.get("split", Split.ALL.value), goal_index)
        else:
            train = split_range(Split.TRAIN, engine.num_goals) or split_range(Split.ALL, engine.num_goals)
            goal_index = train[secrets.randbelow(len(train))]
        return redirect(f"/{new_session(goal_index)}")

    def show(session_id: str, state: PageState) -> Response:
        with store.use(session_id) as session:
            if session.done:
                return redirect(f"/done/{session_id}", code=303)
            problem = engine.navigate(session, state)
            if problem:
                raise RequestError(404, problem)
            _forget_old_visits(session)
            return Response(render_html(engine, session), mimetype="text/html")

    @app.get("/<session_id>")
    def search_page(session_id: str):
        return show(session_id, PageState())

    @app.get("/search_results/<session_id>")
    def results_page(session_id: str):
        return show(session_id, PageState(PageKind.RESULTS, *keywords_and_page(request.args)))

    @app.get("/item_page/<session_id>/<asin>")
    def item_page(session_id: str, asin: str):
        keywords, page = keywords_and_page(request.args)
        return show(
            session_id, PageState(PageKind.ITEM, keywords, page, asin=asin, options=_options(request.args))
        )

    @app.get("/item_sub_page/<session_id>/<asin>/<sub_page>")
    def item_sub_page(session_id: str, asin: str, sub_page: str):
        keywords, page = keywords_and_page(request.args)
        try:
            sub = SubPage(sub_page)
        except ValueError:
            raise RequestError(404, f"unknown sub-page {sub_page!r}") from None
        return show(
            session_id,
            PageState(
                PageKind.SUB_PAGE, keywords, page, asin=asin, sub_page=sub, options=_options(request.args)
            ),
        )

    @app.post("/buy/<session_id>")
    def buy(session_id: str):
        keywords, page = keywords_and_page(request.form)
        state = PageState(
            PageKind.ITEM, keywords, page, asin=request.form.get("asin", ""), options=_options(request.form)
        )
        with store.use(session_id) as session:
            if session.done:
                raise finished(session)
            problem = engine.navigate(session, state)
            if problem:
                raise RequestError(400, problem)
            engine.buy(session)
            _forget_old_visits(session)
        return redirect(f"/done/{session_id}", code=303)

    @app.get("/done/<session_id>")
    def done_page(session_id: str):
        with store.use(session_id) as session:
            if not session.done:
                return redirect(page_url(session_id, session.state))
            return Response(render_html(engine, session), mimetype="text/html")

    return app


def _keywords_and_page(args: Any, max_query_chars: int) -> tuple[tuple[str, ...], int]:
    try:
        page = int(args.get("page", "1"))
    except ValueError:
        raise RequestError(400, "page must be an integer") from None
    query = str(args.get("q", ""))
    if len(query) > max_query_chars:
        raise RequestError(400, f"the search query is longer than {max_query_chars} characters")
    return tuple(query.lower().split()), page


def _require_utf8(name: str, text: str) -> None:
    # JSON's \ud800-style escapes decode to lone surrogates, which no URL or page can carry: refuse them
    # before they reach a session (they would break its url and html views later).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        surrogate = text[exc.start]
        raise RequestError(
            400, f"{name} is not valid Unicode text: a lone surrogate {surrogate!r} at character {exc.start}"
        ) from None


def _forget_old_visits(session: Session) -> None:
    del session.visited_asins[:-MAX_VISITED_PRODUCTS]


def _options(args: Any) -> dict[str, str]:
    return {key[len("option:") :]: value for key, value in args.items() if key.startswith("option:")}


def _html_error(status: int, message: str) -> Response:
    from markupsafe import escape

    body = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>WebShop</title>'
        f'<link rel="stylesheet" href="/static/style.css"></head><body><div class="container">'
        f'<h1>{status}</h1><p id="error">{escape(message)}</p><p><a href="/">Start a new session</a></p>'
        f"</div></body></html>"
    )
    return Response(body, status=status, mimetype="text/html")
