"""The WebShop page engine: a pure state machine (session state in, page out), with no Flask and no I/O.

Three doors open onto this one engine: the Flask site and JSON session API (:mod:`webshop_server.app`), the
in-process Gymnasium env (:mod:`progpo_envs.webshop.env`) and the Selenium env
(:mod:`progpo_envs.webshop.browser`, through the Flask site). It reproduces the pages and actions of the
original WebShop (Yao et al., 2022; ``princeton-nlp/WebShop`` ``web_agent_site/envs/web_agent_text_env.py``,
``SimServer.receive`` and the templates),
restated in ``docs/webshop.md`` §1:

* pages: search → results (the top :data:`SEARCH_RETURN_N` = 50 hits, :data:`PRODUCT_WINDOW` = 10 per page) →
  item page (option choice; Description / Features / Reviews sub-pages) → Buy Now → done page with the reward;
* actions: ``search[<query>]`` (where the page has a search bar) and ``click[<clickable>]`` where the
  clickable is one of :meth:`WebShopEngine.available_actions` ``["clickables"]`` (lowercased button texts,
  product ASINs and option values, as upstream's ``get_available_actions``); anything else is an invalid
  action that changes nothing;
* observations in the modes ``html``, ``text`` (visible texts joined by ``" [SEP] "``, upstream's "simple"
  conversion), ``text_rich`` (``[button] x [button_]`` markup and "You have clicked x." prefixes) and ``url``.

Where we differ from upstream, on purpose:

* ``search[...]`` is valid only on a page with a search bar (upstream's text env searched from any page);
  ``EngineConfig.search_from_any_page=True`` restores upstream's behaviour.
* ``Next >`` is shown only while another page of results exists (upstream always showed it, leading to empty
  pages).
* The action name is matched case-insensitively after stripping whitespace (``Click[Buy Now]`` works);
  upstream's greedy regex split ``search[a [b] c]`` at the last ``[``; we split at the first ``[`` and the
  last ``]``.
* Search debug prefixes (``<r>``, ``<a>``, ``<c>``, ``<q>``) do not exist: a query is always plain BM25 text.
* URLs carry keywords and options as query parameters (upstream put Python literals in the path and
  ``literal_eval``-ed them).
* The done page never shows the goal (upstream's done page was a debug view of the goal's ASIN and options).

Example:
    >>> from webshop_server.engine import WebShopEngine, ObservationMode  # doctest: +SKIP
    >>> engine = WebShopEngine.shared(num_products=1000, seed=0)  # doctest: +SKIP
    >>> session = engine.new_session(goal_index=0)  # doctest: +SKIP
    >>> engine.observation(session, ObservationMode.TEXT)[:30]  # doctest: +SKIP
    'WebShop [SEP] Instruction: [SEP]'
    >>> engine.step(session, "search[red shoes]").valid  # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

#: Hits kept per search (upstream ``SEARCH_RETURN_N``).
SEARCH_RETURN_N = 50
#: Results shown per page (upstream ``PRODUCT_WINDOW``).
PRODUCT_WINDOW = 10

#: The lowercased clickables with fixed meanings.
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SEARCH_BUTTON = "search"


class PageKind(str, enum.Enum):
    """The pages of the shop."""

    SEARCH = "search"
    RESULTS = "search_results"
    ITEM = "item_page"
    SUB_PAGE = "item_sub_page"
    DONE = "done"


class SubPage(str, enum.Enum):
    """Item sub-pages (upstream's ``Attributes`` sub-page, shown only with ``--attrs``, is not offered)."""

    DESCRIPTION = "Description"
    FEATURES = "Features"
    REVIEWS = "Reviews"


class ObservationMode(str, enum.Enum):
    """Observation formats of upstream's ``WebAgentTextEnv`` (``observation_mode``)."""

    HTML = "html"
    TEXT = "text"
    TEXT_RICH = "text_rich"
    URL = "url"


class NodeKind(str, enum.Enum):
    """What a visible text of a page is (decides its ``text_rich`` markup and whether it is clickable)."""

    TEXT = "text"
    BUTTON = "button"
    OPTION = "option"
    PRODUCT_LINK = "product_link"


@dataclasses.dataclass(frozen=True)
class Node:
    """One visible text of a page, in document order."""

    kind: NodeKind
    text: str


class SearchBackend(Protocol):
    """What the engine needs from a search index (:class:`webshop_server.search.SearchIndex` is one)."""

    def search(self, query: str, top_k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the best ``top_k`` products for ``query``, best first."""


RewardFn = Callable[..., Any]


class Split(str, enum.Enum):
    """Goal splits of the RL papers (verl-agent / GiGPO: val = 0–499, train = 500+; :func:`split_range`)."""

    TEST = "test"
    TRAIN = "train"
    ALL = "all"


#: Test goals of the standard split (verl-agent ``range(500)``; WebShop's baseline test set is the same 500).
STANDARD_TEST_GOALS = 500


def split_range(split: Split | str, num_goals: int) -> range:
    """The absolute goal indices of ``split``.

    The test split is the first ``min(500, num_goals // 2)`` goals and train is the rest. On a catalog with at
    least 1000 goals this is exactly the papers' split (test 0–499, train 500+); a small generated catalog
    keeps half of its goals for test, so both splits are non-empty whenever there are two goals or more.

    Example:
        >>> split_range("test", 12087), split_range("train", 12087)
        (range(0, 500), range(500, 12087))
        >>> split_range("test", 300), split_range("train", 300)
        (range(0, 150), range(150, 300))
    """
    split = Split(split)
    test_size = min(STANDARD_TEST_GOALS, num_goals // 2)
    if split is Split.TEST:
        return range(0, test_size)
    if split is Split.TRAIN:
        return range(test_size, num_goals)
    return range(0, num_goals)


@dataclasses.dataclass
class EngineConfig:
    """Behaviour switches of the engine.

    Attributes:
        search_from_any_page: Accept ``search[...]`` on every page, like upstream's text env (default: only
            where the page has a search bar, as ``available_actions()["has_search_bar"]`` says).
        search_cache_size: Queries whose result lists are kept (LRU), shared by all sessions.
    """

    search_from_any_page: bool = False
    search_cache_size: int = 4096


@dataclasses.dataclass
class PageState:
    """Where a session is: everything a page URL encodes."""

    kind: PageKind = PageKind.SEARCH
    keywords: tuple[str, ...] = ()
    page: int = 1
    asin: str | None = None
    sub_page: SubPage | None = None
    options: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Session:
    """One shopper working on one goal.

    Attributes:
        session_id: Shown in URLs (``fixed_<goal>`` in-process, like upstream; random on the server).
        goal_index: Index into ``catalog.goals`` (absolute, not split-relative).
        state: The current page.
        visited_asins: Products opened so far, in order (``text_rich`` marks them clicked).
        score: The raw reward (0–1) once bought.
        purchased: ``(asin, options)`` once bought.
    """

    session_id: str
    goal_index: int
    state: PageState = dataclasses.field(default_factory=PageState)
    visited_asins: list[str] = dataclasses.field(default_factory=list)
    score: float | None = None
    purchased: tuple[str, dict[str, str]] | None = None

    @property
    def done(self) -> bool:
        """Whether the shopper has bought something (the episode is over)."""
        return self.state.kind is PageKind.DONE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for session stores shared by several server processes)."""
        state = self.state
        return {
            "session_id": self.session_id,
            "goal_index": self.goal_index,
            "state": {
                "kind": state.kind.value,
                "keywords": list(state.keywords),
                "page": state.page,
                "asin": state.asin,
                "sub_page": state.sub_page.value if state.sub_page else None,
                "options": dict(state.options),
            },
            "visited_asins": list(self.visited_asins),
            "score": self.score,
            "purchased": [self.purchased[0], dict(self.purchased[1])] if self.purchased else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        """The inverse of :meth:`to_dict`."""
        state = data["state"]
        return cls(
            session_id=data["session_id"],
            goal_index=int(data["goal_index"]),
            state=PageState(
                PageKind(state["kind"]),
                tuple(state["keywords"]),
                int(state["page"]),
                state["asin"],
                SubPage(state["sub_page"]) if state["sub_page"] else None,
                dict(state["options"]),
            ),
            visited_asins=list(data["visited_asins"]),
            score=data["score"],
            purchased=(data["purchased"][0], dict(data["purchased"][1])) if data["purchased"] else None,
        )


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """The result of one action.

    Attributes:
        valid: Whether the action was admissible (an invalid action changes nothing).
        score: The raw reward: the purchase's score on Buy Now, else 0.
        done: Whether the episode ended with this action.
        message: Why an action was invalid (for humans and logs; never part of the observation).
    """

    valid: bool
    score: float
    done: bool
    message: str = ""


def parse_action(action: str) -> tuple[str, str | None]:
    """Split ``name[argument]`` into the lowercased name and the raw argument (``None`` when not bracketed).

    Example:
        >>> parse_action(" Click[Buy Now] ")
        ('click', 'Buy Now')
        >>> parse_action("look around")
        ('look around', None)
    """
    text = action.strip()
    start = text.find("[")
    if start <= 0 or not text.endswith("]"):
        return text.lower(), None
    return text[:start].strip().lower(), text[start + 1 : -1]


class WebShopEngine:
    """Pages, actions and rewards of the shop over one catalog and one search index (shared by all sessions).

    Args:
        catalog: A :class:`webshop_server.catalog.Catalog` (``products``, ``product_by_asin``,
            ``product_prices``, ``goals``, ``fingerprint``).
        index: A :class:`SearchBackend`.
        reward_fn: ``get_reward(product, goal, price=, options=)`` (default
        :func:`webshop_server.reward.get_reward`). config: :class:`EngineConfig`.
    """

    _shared: dict[tuple, WebShopEngine] = {}
    _shared_lock = threading.Lock()

    def __init__(
        self,
        catalog: Any,
        index: SearchBackend,
        reward_fn: RewardFn | None = None,
        config: EngineConfig | None = None,
    ):
        if reward_fn is None:
            from webshop_server.reward import get_reward as reward_fn
        self.catalog = catalog
        self.index = index
        self.reward_fn = reward_fn
        self.config = config or EngineConfig()
        self._search_cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._search_lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_search_lock")
        state["_search_cache"] = OrderedDict()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._search_lock = threading.Lock()

    # --- construction ---------------------------------------------------------------------------------------
    @classmethod
    def shared(
        cls,
        num_products: int | None = 1000,
        seed: int = 0,
        *,
        data_dir: str | Path | None = None,
        human_goals: bool = True,
        cache_dir: str | Path | None = None,
    ) -> WebShopEngine:
        """The process-wide engine for a catalog: built once, then shared by every env copy and request.

        The catalog is :func:`webshop_server.catalog.default_catalog` (generated and cached on first use, or
        read from ``data_dir``) and the index is :class:`webshop_server.search.SearchIndex` (cached by catalog
        fingerprint; both under ``cache_dir`` when given, else in the default cache). ``num_products=None``
        means all products of ``data_dir`` (or the generator's default size).
        """
        key = (
            None if num_products is None else int(num_products),
            int(seed),
            str(data_dir) if data_dir else None,
            bool(human_goals),
            str(cache_dir) if cache_dir else None,
        )
        with cls._shared_lock:
            engine = cls._shared.get(key)
            if engine is None:
                from webshop_server.catalog import default_catalog
                from webshop_server.search import SearchIndex

                catalog = default_catalog(
                    num_products, seed, data_dir=data_dir, human_goals=human_goals, cache_dir=cache_dir
                )
                index = SearchIndex.open_or_build(catalog, Path(cache_dir) / "index" if cache_dir else None)
                engine = cls._shared[key] = cls(catalog, index)
            return engine

    # --- goals and sessions ---------------------------------------------------------------------------------
    @property
    def num_goals(self) -> int:
        """Goals in the catalog (all splits)."""
        return len(self.catalog.goals)

    def goal(self, goal_index: int) -> dict:
        """The goal dict (server side only: never show it to an agent)."""
        return self.catalog.goals[goal_index]

    def instruction(self, session: Session) -> str:
        """The goal's instruction text (what the shopper is asked to buy; shown on every page)."""
        return str(self.goal(session.goal_index)["instruction_text"])

    def new_session(self, goal_index: int, session_id: str | None = None) -> Session:
        """A session on the search page for goal ``goal_index`` (absolute index into ``catalog.goals``)."""
        if not 0 <= goal_index < self.num_goals:
            raise IndexError(f"goal_index {goal_index} out of range: the catalog has {self.num_goals} goals")
        return Session(session_id=session_id or f"fixed_{goal_index}", goal_index=int(goal_index))

    # --- search ---------------------------------------------------------------------------------------------
    def search(self, keywords: Sequence[str]) -> tuple[str, ...]:
        """The top :data:`SEARCH_RETURN_N` ASINs for ``keywords`` (cached; unknown ASINs dropped)."""
        query = " ".join(keywords)
        with self._search_lock:
            hit = self._search_cache.get(query)
            if hit is not None:
                self._search_cache.move_to_end(query)
                return hit
        by_asin = self.catalog.product_by_asin
        asins = tuple(a for a in self.index.search(query, top_k=SEARCH_RETURN_N) if a in by_asin)[
            :SEARCH_RETURN_N
        ]
        with self._search_lock:
            self._search_cache[query] = asins
            while len(self._search_cache) > self.config.search_cache_size:
                self._search_cache.popitem(last=False)
        return asins

    def clear_search_cache(self) -> None:
        """Forget the cached search results (the next search of each query asks the index again)."""
        with self._search_lock:
            self._search_cache.clear()

    def num_result_pages(self, keywords: Sequence[str]) -> int:
        """Pages of results for ``keywords`` (at least 1, an empty page when nothing matched)."""
        return max(1, math.ceil(len(self.search(keywords)) / PRODUCT_WINDOW))

    # --- pages ----------------------------------------------------------------------------------------------
    def product(self, asin: str) -> dict:
        """The processed product dict of ``asin``."""
        return self.catalog.product_by_asin[asin]

    def page_context(self, session: Session) -> dict[str, Any]:
        """Everything a template needs to draw the current page (the goal's instruction, never the goal)."""
        state = session.state
        ctx: dict[str, Any] = {
            "kind": state.kind.value,
            "session_id": session.session_id,
            "instruction": self.instruction(session),
            "keywords": " ".join(state.keywords),
            "page": state.page,
        }
        if state.kind is PageKind.RESULTS:
            asins = self.search(state.keywords)
            window = asins[(state.page - 1) * PRODUCT_WINDOW : state.page * PRODUCT_WINDOW]
            ctx.update(
                total=len(asins),
                has_prev=state.page > 1,
                has_next=state.page < self.num_result_pages(state.keywords),
                products=[
                    {"asin": a, "title": self.product(a)["Title"], "price": self.product(a)["Price"]}
                    for a in window
                ],
            )
        elif state.kind in (PageKind.ITEM, PageKind.SUB_PAGE):
            product = self.product(state.asin)
            ctx.update(
                asin=state.asin,
                title=product["Title"],
                price=product["Price"],
                rating=product.get("Rating", "N.A."),
                chosen=dict(state.options),
                option_axes=[(name, list(values)) for name, values in (product.get("options") or {}).items()],
                sub_page=state.sub_page.value if state.sub_page else None,
            )
            if state.kind is PageKind.SUB_PAGE:
                ctx["sub_page_texts"] = self._sub_page_texts(product, state.sub_page)
        elif state.kind is PageKind.DONE:
            asin, options = session.purchased
            ctx.update(
                asin=asin,
                title=self.product(asin)["Title"],
                chosen=dict(options),
                score=repr(float(session.score)),
            )
        return ctx

    @staticmethod
    def _sub_page_texts(product: dict, sub_page: SubPage) -> list[str]:
        if sub_page is SubPage.DESCRIPTION:
            texts = [product.get("Description") or ""]
        elif sub_page is SubPage.FEATURES:
            texts = list(product.get("BulletPoints") or [])
        else:
            texts = [_review_text(r) for r in product.get("Reviews") or []]
        return [t.strip() for t in texts if isinstance(t, str) and t.strip()]

    def nodes(self, session: Session) -> list[Node]:
        """The page's visible texts in document order (the text modes join these; the HTML shows them)."""
        ctx = self.page_context(session)
        kind = session.state.kind
        B, T = NodeKind.BUTTON, NodeKind.TEXT
        if kind is PageKind.SEARCH:
            return [
                Node(T, "WebShop"),
                Node(T, "Instruction:"),
                Node(T, ctx["instruction"]),
                Node(B, "Search"),
            ]
        nodes = [Node(T, "Instruction:"), Node(T, ctx["instruction"])] if kind is not PageKind.DONE else []
        if kind is PageKind.RESULTS:
            nodes += [
                Node(B, "Back to Search"),
                Node(T, f"Page {ctx['page']} (Total results: {ctx['total']})"),
            ]
            if ctx["has_prev"]:
                nodes.append(Node(B, "< Prev"))
            if ctx["has_next"]:
                nodes.append(Node(B, "Next >"))
            for p in ctx["products"]:
                nodes += [Node(NodeKind.PRODUCT_LINK, p["asin"]), Node(T, p["title"]), Node(T, p["price"])]
        elif kind is PageKind.ITEM:
            nodes += [Node(B, "Back to Search"), Node(B, "< Prev")]
            for name, values in ctx["option_axes"]:
                nodes.append(Node(T, name))
                nodes += [Node(NodeKind.OPTION, v) for v in values]
            nodes += [
                Node(T, ctx["title"]),
                Node(T, f"Price: {ctx['price']}"),
                Node(T, f"Rating: {ctx['rating']}"),
            ]
            nodes += [Node(B, s.value) for s in SubPage] + [Node(B, "Buy Now")]
        elif kind is PageKind.SUB_PAGE:
            nodes += [Node(B, "Back to Search"), Node(B, "< Prev")]
            nodes += [Node(T, t) for t in ctx["sub_page_texts"]]
        elif kind is PageKind.DONE:
            nodes += [
                Node(T, "Thank you for shopping with us!"),
                Node(T, "Purchased"),
                Node(T, ctx["asin"]),
                Node(T, ctx["title"]),
            ]
            nodes += [Node(T, f"{k}: {v}") for k, v in ctx["chosen"].items()]
            nodes += [Node(T, "Your score (min 0.0, max 1.0)"), Node(T, ctx["score"])]
        return [n for n in nodes if n.text.strip()]

    def observation(
        self,
        session: Session,
        mode: ObservationMode | str = ObservationMode.TEXT,
        *,
        html_renderer: Callable[[Session], str] | None = None,
        base_url: str = "",
    ) -> str:
        """The current page as ``mode`` (``html`` needs the Flask templates: see :func:`render_html`)."""
        mode = ObservationMode(mode)
        if mode is ObservationMode.TEXT:
            return " [SEP] ".join(_clean(n.text) for n in self.nodes(session))
        if mode is ObservationMode.TEXT_RICH:
            return self._text_rich(session)
        if mode is ObservationMode.URL:
            return base_url + self.url(session)
        return (html_renderer or render_html)(self, session)

    def _text_rich(self, session: Session) -> str:
        # Upstream's convert_html_to_text(simple=False): buttons, option labels and product links get markup;
        # a chosen option adds "You have clicked X." in front of the whole observation.
        prefix, body = "", ""
        chosen = set(session.state.options.values())
        visited = set(session.visited_asins)
        for node in self.nodes(session):
            text = _clean(node.text)
            if node.kind is NodeKind.BUTTON:
                body += f"[button] {text} [button_]\n"
            elif node.kind is NodeKind.OPTION:
                if node.text in chosen:
                    body += f"  [clicked button] {text} [clicked button_]\n"
                    prefix = f"You have clicked {text}.\n" + prefix
                else:
                    body += f"  [button] {text} [button_]\n"
            elif node.kind is NodeKind.PRODUCT_LINK:
                mark = "clicked button" if node.text in visited else "button"
                body += f"\n[{mark}] {text} [{mark}_]\n"
            else:
                body += f"\n{text}\n"
        return prefix + body

    def url(self, session: Session) -> str:
        """The path of the current page on the Flask site."""
        return page_url(session.session_id, session.state)

    # --- actions --------------------------------------------------------------------------------------------
    def available_actions(self, session: Session) -> dict[str, Any]:
        """``{"has_search_bar", "clickables"}`` (lowercased), as upstream's ``get_available_actions``."""
        # Upstream's order: every .btn, then every .product-link, then every option radio.
        nodes = self.nodes(session)
        clickables: list[str] = []
        for kind in (NodeKind.BUTTON, NodeKind.PRODUCT_LINK, NodeKind.OPTION):
            clickables += [n.text.lower() for n in nodes if n.kind is kind]
        return {"has_search_bar": session.state.kind is PageKind.SEARCH, "clickables": clickables}

    def step(self, session: Session, action: str) -> StepOutcome:
        """Apply one action string; invalid actions change nothing and never raise."""
        if not isinstance(action, str):
            return StepOutcome(False, 0.0, False, "action is not a string")
        if session.done:
            return StepOutcome(False, 0.0, False, "the episode is over")
        name, arg = parse_action(action)
        if name == "search":
            if arg is None or not arg.strip():
                return StepOutcome(False, 0.0, False, "search needs a non-empty query: search[...]")
            if session.state.kind is not PageKind.SEARCH and not self.config.search_from_any_page:
                return StepOutcome(False, 0.0, False, "there is no search bar on this page")
            session.state = PageState(PageKind.RESULTS, keywords=tuple(arg.lower().split()), page=1)
            return StepOutcome(True, 0.0, False)
        if name != "click" or arg is None:
            return StepOutcome(False, 0.0, False, "actions are search[...] or click[...]")
        return self._click(session, arg.strip().lower())

    def _click(self, session: Session, target: str) -> StepOutcome:
        if target == SEARCH_BUTTON or target not in self.available_actions(session)["clickables"]:
            return StepOutcome(False, 0.0, False, f"{target!r} is not clickable on this page")
        state = session.state
        if target == BACK_TO_SEARCH:
            session.state = PageState()
        elif state.kind is PageKind.RESULTS:
            if target == NEXT_PAGE:
                state.page += 1
            elif target == PREV_PAGE:
                state.page -= 1
            else:
                asin = target.upper()
                session.state = PageState(PageKind.ITEM, state.keywords, state.page, asin=asin)
                if asin not in session.visited_asins:
                    session.visited_asins.append(asin)
        elif state.kind is PageKind.SUB_PAGE:  # the only other button is "< prev"
            state.kind, state.sub_page = PageKind.ITEM, None
        elif state.kind is PageKind.ITEM:
            if target == PREV_PAGE:
                session.state = PageState(PageKind.RESULTS, state.keywords, state.page)
            elif target == BUY_NOW:
                return self.buy(session)
            elif target in {s.value.lower() for s in SubPage}:
                state.kind, state.sub_page = PageKind.SUB_PAGE, SubPage(target.capitalize())
            else:
                for name, values in (self.product(state.asin).get("options") or {}).items():
                    if target in values:
                        state.options[name] = target
                        break
        return StepOutcome(True, 0.0, False)

    def buy(self, session: Session) -> StepOutcome:
        """Buy the product on the current item page with the chosen options; score it; end the session."""
        state = session.state
        asin, options = state.asin, dict(state.options)
        score = float(
            self.reward_fn(
                self.product(asin),
                self.goal(session.goal_index),
                price=self.catalog.product_prices[asin],
                options=options,
            )
        )
        session.score, session.purchased = score, (asin, options)
        session.state = PageState(PageKind.DONE, state.keywords, state.page, asin=asin, options=options)
        return StepOutcome(True, score, True)

    # --- URL navigation (the human site) --------------------------------------------------------------------
    def navigate(self, session: Session, state: PageState) -> str | None:
        """Move ``session`` to the page a URL asks for; returns an error message if it can't exist.

        The checks are those the actions enforce: a known product, options it offers, a page in range.
        """
        if session.done:
            return None  # every URL of a finished session shows its done page
        if state.kind in (PageKind.ITEM, PageKind.SUB_PAGE):
            if state.asin not in self.catalog.product_by_asin:
                return f"unknown product {state.asin!r}"
            offered = self.product(state.asin).get("options") or {}
            for name, value in state.options.items():
                if value not in offered.get(name, ()):
                    return f"product {state.asin} has no option {name}: {value!r}"
            if state.kind is PageKind.SUB_PAGE and state.sub_page is None:
                return "unknown sub-page"
        if state.kind in (PageKind.RESULTS, PageKind.ITEM, PageKind.SUB_PAGE):
            if not 1 <= state.page <= self.num_result_pages(state.keywords):
                return f"page {state.page} out of range"
        if state.kind is PageKind.DONE:
            return "buy with the Buy Now button"
        session.state = state
        if state.asin and state.asin not in session.visited_asins:
            session.visited_asins.append(state.asin)
        return None


def admissible_actions(available: dict[str, Any]) -> list[str]:
    """The valid action strings of a page's available actions (``search[<query>]`` stands for any query).

    Example:
        >>> admissible_actions({"has_search_bar": True, "clickables": ["search"]})
        ['search[<query>]']
    """
    out = ["search[<query>]"] if available["has_search_bar"] else []
    return out + [f"click[{c}]" for c in available["clickables"] if c != SEARCH_BUTTON]


def page_url(session_id: str, state: PageState) -> str:
    """The site path of a page (keywords and options as query parameters)."""
    query: list[tuple[str, str]] = []
    if state.kind is not PageKind.SEARCH:
        query += [("q", " ".join(state.keywords)), ("page", str(state.page))]
    query += [(f"option:{name}", value) for name, value in sorted(state.options.items())]
    if state.kind is PageKind.SEARCH:
        path = f"/{session_id}"
    elif state.kind is PageKind.RESULTS:
        path = f"/search_results/{session_id}"
    elif state.kind is PageKind.ITEM:
        path = f"/item_page/{session_id}/{state.asin}"
    elif state.kind is PageKind.SUB_PAGE:
        path = f"/item_sub_page/{session_id}/{state.asin}/{state.sub_page.value}"
    else:
        path = f"/done/{session_id}"
    return path + ("?" + urlencode(query) if query else "")


def _review_text(review: Any) -> str:
    if isinstance(review, dict):
        return " ".join(str(review.get(k, "")) for k in ("title", "body", "text") if review.get(k))
    return str(review)


def _clean(text: str) -> str:
    return " ".join(text.split())


_template_env = None
_template_lock = threading.Lock()


def render_html(engine: WebShopEngine, session: Session) -> str:
    """The page as the Flask site serves it (Jinja2 templates in ``webshop_server/templates``)."""
    global _template_env
    with _template_lock:
        if _template_env is None:
            import jinja2

            _template_env = jinja2.Environment(
                loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                autoescape=jinja2.select_autoescape(["html"]),
                trim_blocks=True,
                lstrip_blocks=True,
            )
            _template_env.globals["page_url"] = page_url
            _template_env.globals["with_option"] = lambda chosen, name, value: {**chosen, name: value}
    ctx = engine.page_context(session)
    return _template_env.get_template(f"{session.state.kind.value}.html").render(
        ctx=ctx, state=session.state, PageState=PageState, PageKind=PageKind, SubPage=SubPage
    )
