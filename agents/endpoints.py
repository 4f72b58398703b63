"""What answers at a URL a user gave ``progpo eval``: an env server, a WebShop site, or nothing.

``progpo eval`` takes three kinds of URL: ``--env-url``, one or several **env servers** (``progpo serve``: the
env is played through ``progpo/Remote-v0`` on them, whatever the env); ``--shop-url``, a **WebShop site**
(``progpo webshop serve``: ``progpo/WebShop-v0`` runs in this process and plays against the site's session
API); and ``--base-url``, the model's OpenAI-compatible endpoint. Each kind is told by a route only it has:
an env server answers ``GET /envs`` with the env ids it hosts, a WebShop site answers ``GET /api/info`` with
its catalog. Before anything is built, :func:`check_env_server`, :func:`check_shop_site` and
:func:`check_listening` say in one line (:class:`~progpo_base.usage.UsageError`) when a URL is the wrong kind
of server, hosts another env, or has nothing listening: a refused connection is said at once, instead of
after the retries meant for a server that restarts mid-run.

A server that answers neither route (an older server, a proxy in front) or answers too slowly is let
through: the run's own requests, with their deadlines and retries, deal with it.

Example:
    >>> check_env_server("--env-url", "http://127.0.0.1:9", "progpo/ALFWorld-v0")  # doctest: +SKIP
    Traceback (most recent call last):
    progpo_base.usage.UsageError: --env-url http://127.0.0.1:9: nothing listens there (connection refused) ...
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import requests

from progpo_base.usage import UsageError
from progpo_envs.core.http_client import DeadlineSession

#: Seconds a probe may take (each request); a slower server is let through.
PROBE_DEADLINE_S = 5.0
#: The kinds of server, each with the route only it answers.
ENV_SERVER, SHOP_SITE = "env server", "WebShop site"
ROUTES = {ENV_SERVER: "/envs", SHOP_SITE: "/api/info"}
#: How each kind is started, and its docker compose port, for the messages.
STARTED_BY = {
    ENV_SERVER: "progpo serve; docker compose: ALFWorld :8000, WebShop :8001",
    SHOP_SITE: "progpo webshop serve; docker compose: :3000",
}


def _unreachable(flag: str, url: str, error: Exception) -> UsageError:
    text = str(error)
    if "Connection refused" in text or isinstance(error, ConnectionRefusedError):
        reason = "nothing listens there (connection refused): start the server, or fix the URL"
    elif "Name or service not known" in text or "nodename nor servname" in text or "resolve" in text.lower():
        reason = f"cannot resolve {urlsplit(url).hostname}: fix the URL"
    else:
        reason = f"cannot connect ({' '.join(text.split())[:200]})"
    return UsageError(f"{flag} {url}: {reason}")


def server_kind(flag: str, url: str) -> tuple[str | None, object]:
    """``(kind, answer)``: :data:`ENV_SERVER` or :data:`SHOP_SITE` with the JSON its own route answered, or
    ``(None, None)`` when it answers neither in time; :class:`UsageError` when nothing listens at ``url``."""
    base = url.rstrip("/")
    with DeadlineSession(PROBE_DEADLINE_S) as session:
        for kind, route in ROUTES.items():
            try:
                answer = session.get(base + route)
            except requests.Timeout:
                return None, None
            except requests.ConnectionError as error:
                raise _unreachable(flag, url, error) from None
            if answer.status_code == 200:
                try:
                    return kind, answer.json()
                except ValueError:  # not JSON: another server that happens to have the route
                    continue
    return None, None


def check_env_server(flag: str, url: str, hosted_id: str | None) -> None:
    """``url`` is an env server that hosts ``hosted_id`` (``None``: any env), else one line saying what it
    is and what to give instead."""
    kind, answer = server_kind(flag, url)
    if kind == SHOP_SITE:
        raise UsageError(
            f"{flag} {url} is a {SHOP_SITE} (it answers {ROUTES[SHOP_SITE]}), not an env server: give it as "
            f"--shop-url to play progpo/WebShop-v0 against it, or give the env server's URL "
            f"({STARTED_BY[ENV_SERVER]})"
        )
    if kind == ENV_SERVER and hosted_id is not None and isinstance(answer, dict) and hosted_id not in answer:
        hosted = ", ".join(sorted(answer)) or "none"
        raise UsageError(f"{flag} {url} hosts {hosted}, not {hosted_id}: give the server that hosts it")


def check_shop_site(flag: str, url: str) -> None:
    """``url`` is a WebShop site, else one line saying what it is and what to give instead."""
    kind, _ = server_kind(flag, url)
    if kind == ENV_SERVER:
        raise UsageError(
            f"{flag} {url} is an env server (it answers {ROUTES[ENV_SERVER]}), not a {SHOP_SITE}: give it as "
            f"--env-url to play through it, or give the site's URL ({STARTED_BY[SHOP_SITE]})"
        )


def check_listening(flag: str, url: str) -> None:
    """Something accepts connections at ``url``'s host and port (a TCP connect, nothing sent), else one
    line: a refused connection or a host name that does not resolve. Skipped when the environment names a
    proxy for ``url`` (the connection then goes to the proxy); a connect that times out is let through."""
    if requests.utils.get_environ_proxies(url):
        return
    parts = urlsplit(url)
    if parts.hostname is None:
        raise UsageError(f"{flag} {url}: not a URL (e.g. http://127.0.0.1:8000/v1)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=PROBE_DEADLINE_S):
            pass
    except TimeoutError:
        return
    except OSError as error:
        raise _unreachable(flag, url, error) from None
