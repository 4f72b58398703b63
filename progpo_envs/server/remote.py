"""A Gymnasium env that plays an env hosted by an env server (``progpo/Remote-v0``).

``gymnasium.make("progpo/Remote-v0", url=..., env_id="progpo/ALFWorld-v0", **env_kwargs)`` creates an instance
on the server and behaves like the in-process env: the same observations, rewards, flags and infos (numpy
``uint64`` keys and int-keyed ``history_keys`` included, through :mod:`progpo_envs.server.codec`) for the same
seed. Because it is a text env like the others, the group vector env works over it::

    envs = gymnasium.make_vec("progpo/Remote-v0", num_envs=8, group_size=4, url=url,
    env_id="progpo/ALFWorld-v0")

Networking (``transport``): by default every call is one message on the server's stream door (``GET
/stream`` as a WebSocket, :mod:`progpo_envs.server.stream`): persistent connections shared by all the remote
envs of the process to one server (:class:`~progpo_envs.server.websocket.ClientPool`: as many as the calls in
flight, at most :data:`MAX_CONNECTIONS_PER_SERVER`; past it a call waits for one), one frame per call and one
per answer, the answer's JSON parsed once. Where the server has no stream door (it answers the upgrade with
400, 404, 405, 426 or 501: an older server, gunicorn, a proxy that drops the upgrade) or the environment names
a proxy for its URL, the calls go to the HTTP routes instead (``transport="auto"``, the default; ``"stream"``
or ``"http"`` force one), on keep-alive connections shared and bounded the same way. Both give the same
answers. Every call has a wall-clock deadline, ``timeout`` seconds for all its attempts together, so a server
or proxy that answers a byte at a time cannot hold a trainer (the call fails with
:class:`ServerUnavailableError` naming the deadline). Every call is retried with exponential back-off on
connection errors (a connection closed before its answer, as a server closes an idle one to make room, among
them), timeouts and 502/503/504 while time is left, because every call is safe to send twice: reads and
close change nothing twice, a reset or step carries a ``seq`` number and a create an ``idempotency_key``,
which the server answers from its first attempt when that one acted. When the server stays unreachable the
error says so (:class:`ServerUnavailableError`); an instance the server no longer has raises
:class:`InstanceLostError`; every error names the server's URL. A URL that cannot name a server (a port
that is not a number from 1 to 65535, another scheme) is a :class:`ValueError` before any request
(:func:`check_server_url`), and ``https://`` to a server that speaks plain HTTP fails at once (its TLS
handshake cannot succeed; trying again does not help).

:func:`step_batch` and :func:`reset_batch` act on many remote envs of one server in a single request, and
:class:`RemoteGroupVectorEnv` (``make_vec``'s vector env for the remote id) uses them for every vector step.

Example:
    >>> import gymnasium as gym, progpo_envs
    >>> url = "http://127.0.0.1:8000"
    >>> env = gym.make("progpo/Remote-v0", url=url, env_id="progpo/ALFWorld-v0")  # doctest: +SKIP
    >>> obs, info = env.reset(seed=0)  # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step("look")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym
import requests

from progpo_envs.core.http_client import DeadlineSession
from progpo_envs.core.registration import REMOTE_ENV_ID
from progpo_envs.core.spaces import MAX_ACTION_LENGTH, MAX_OBSERVATION_LENGTH, Unicode
from progpo_envs.core.vector import GroupVectorEnv, VectorMode
from progpo_envs.core.worker_protocol import Call, VectorBackend, apply_command
from progpo_envs.server.codec import decode, encode
from progpo_envs.server.websocket import (
    CLOSE_TOO_BIG,
    STREAM_PATH,
    ClientPool,
    ConnectionClosed,
    DeadlineExceeded,
    ExchangeFailed,
    HandshakeRefused,
    ProtocolError,
    TLSFailed,
)
from webshop_server.clients import CLIENT_TOKEN_VAR

_RETRY_STATUSES = {502, 503, 504}
#: How a remote env reaches its server: the stream door where the server has it (``auto``), the stream door
#: only, or the HTTP routes only.
TRANSPORTS = ("auto", "stream", "http")
#: Statuses of an upgrade that say the server (or a proxy before it) has no stream door: ``auto`` then takes
#: the HTTP routes.
_NO_STREAM_DOOR = {400, 404, 405, 426, 501}


class RemoteEnvError(RuntimeError):
    """The server answered with an error.

    Attributes:
        status: The HTTP status (``None`` when no answer came).
        message: The server's message.
    """

    def __init__(self, status: int | None, message: str):
        super().__init__(f"[{status}] {message}" if status is not None else message)
        self.status = status
        self.message = message


class ServerUnavailableError(RemoteEnvError):
    """The server could not be reached (after the retries)."""


class InstanceLostError(RemoteEnvError):
    """The server no longer has this instance (expired, closed, or its worker died); make a new env."""


def check_server_url(url: str) -> str:
    """``url`` as an env server's base URL (spaces and a trailing ``/`` dropped), checked before any request:
    ``http://`` or ``https://``, a host, a port from 1 to 65535 when one is named, no query or fragment (a
    path prefix, as a proxy may mount the server under, is kept).

    Raises:
        ValueError: One line naming the URL and what is wrong with it.

    Example:
        >>> check_server_url(" http://127.0.0.1:8000/ ")
        'http://127.0.0.1:8000'
        >>> check_server_url("http://127.0.0.1:0")
        Traceback (most recent call last):
        ...
        ValueError: env server url 'http://127.0.0.1:0': the port must be a number from 1 to 65535, not '0'
    """
    text = str(url).strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"an env server url must start with http:// or https:// and name a host, got {url!r}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"env server url {text!r}: a server's url has no query or fragment")
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raw = parts.netloc.rsplit(":", 1)[-1]
        raise ValueError(f"env server url {text!r}: the port must be a number from 1 to 65535, not {raw!r}")
    return text


def _tls_failure(url: str, detail: str) -> ServerUnavailableError:
    """The error of a TLS handshake that failed: said at once, since trying again cannot help."""
    return ServerUnavailableError(
        None,
        f"env server at {url}: {detail}; an http:// server named https:// fails so (check the url's scheme), "
        "as does a certificate this machine does not trust",
    )


def stream_route(method: str, path: str) -> tuple[str, str | None] | None:
    """The stream door's ``(op, instance_id)`` for an HTTP route (:data:`~progpo_envs.server.native.OPS`),
    or ``None`` for a route the door does not carry (health, metrics, ...).

    Example:
        >>> stream_route("POST", "/instances/abc/step"), stream_route("POST", "/batch/reset")
        (('step', 'abc'), ('batch_reset', None))
        >>> stream_route("GET", "/metrics") is None
        True
    """
    parts = path.strip("/").split("/")
    if parts[0] == "batch" and len(parts) == 2 and method == "POST" and parts[1] in ("step", "reset"):
        return f"batch_{parts[1]}", None
    if parts[0] != "instances":
        return None
    if len(parts) == 1:
        return ("create", None) if method == "POST" else None
    if len(parts) == 2:
        return {"GET": ("get", parts[1]), "DELETE": ("close", parts[1])}.get(method)
    ops = {
        ("POST", "reset"),
        ("POST", "step"),
        ("GET", "observation"),
        ("GET", "available_actions"),
        ("GET", "expert"),
    }
    if len(parts) == 3 and (method, parts[2]) in ops:
        return parts[2], parts[1]
    return None


#: Connections one process opens to one server through each door, at most (:class:`ClientPool`): a quarter of
#: the share of connections a server gives one client host (256 of its 1,024), so four processes of one host
#: (a trainer's ranks, an evaluation beside them) fit in it; more calls in flight wait for a connection.
MAX_CONNECTIONS_PER_SERVER = 64


class _HttpConnection:
    """One keep-alive connection to a server's HTTP routes, as a :class:`ClientPool` lends it: a
    :class:`~progpo_envs.core.http_client.DeadlineSession` that keeps one connection."""

    def __init__(self, authorization: str | None, connect_timeout: float):
        self.pid = os.getpid()
        self.session = DeadlineSession(connect_timeout, connect_timeout=connect_timeout, pool_maxsize=1)
        if authorization:
            self.session.headers["Authorization"] = authorization

    def stale(self) -> bool:
        return os.getpid() != self.pid  # a dropped keep-alive connection is urllib3's to notice

    def close(self) -> None:
        self.session.close()


@dataclasses.dataclass
class _Connections:
    """This process's connections to one server (for one client token), shared by all its remote envs: the
    stream door's and the HTTP routes', each at most :data:`MAX_CONNECTIONS_PER_SERVER`, and why ``auto``
    takes the HTTP routes of that server (its answer to the upgrade; ``None``: it has the stream door)."""

    stream: ClientPool
    http: ClientPool
    no_door: str | None = None


_CONNECTIONS: dict[tuple[str, str | None, float, int], _Connections] = {}
_CONNECTIONS_LOCK = threading.Lock()


def _connections(url: str, authorization: str | None, connect_timeout: float) -> _Connections:
    """The process's :class:`_Connections` to ``url`` for one client token (made on first use; a forked
    process makes its own)."""
    key = (url, authorization, connect_timeout, os.getpid())
    with _CONNECTIONS_LOCK:
        connections = _CONNECTIONS.get(key)
        if connections is None:
            ws_url = "ws" + url[len("http") :] + STREAM_PATH  # http -> ws, https -> wss
            headers = {"Authorization": authorization} if authorization else {}
            connections = _CONNECTIONS[key] = _Connections(
                ClientPool(
                    ws_url,
                    headers,
                    connect_timeout=connect_timeout,
                    max_connections=MAX_CONNECTIONS_PER_SERVER,
                ),
                ClientPool(
                    url,
                    max_connections=MAX_CONNECTIONS_PER_SERVER,
                    opener=lambda _deadline: _HttpConnection(authorization, connect_timeout),
                ),
            )
        return connections


def largest_stream_connections() -> dict[str, int]:
    """Per server this process reached through its stream door (by ``ws://`` URL): the most bytes, calls and
    answers together, that one of its connections carried (a long run's soak checks that no bound is per
    connection)."""
    with _CONNECTIONS_LOCK:
        pools = [c.stream for key, c in _CONNECTIONS.items() if key[3] == os.getpid()]
    largest: dict[str, int] = {}
    for pool in pools:
        largest[pool.url] = max(largest.get(pool.url, 0), pool.largest_connection_bytes)
    return largest


class _AttemptFailed(Exception):
    """An attempt that got no answer (no connection, a connection closed or reset, no answer by the
    deadline): tried again while time is left. Every call is safe to send again: reads and close change
    nothing twice, a reset or step carries its ``seq`` and a create its ``idempotency_key``, which the server
    answers from the first attempt when it had acted."""


class _Client:
    """Calls to one server with a deadline per call and retries (see the module docstring)."""

    def __init__(
        self,
        url: str,
        timeout: float,
        connect_timeout: float,
        retries: int,
        backoff: float,
        token: str | None = None,
        transport: str = "auto",
    ):
        url = check_server_url(url)
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.url = url
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        token = token if token is not None else os.environ.get(CLIENT_TOKEN_VAR)
        authorization = f"Bearer {token}" if token else None
        self.connections = _connections(self.url, authorization, float(connect_timeout))
        proxied = transport == "auto" and bool(requests.utils.get_environ_proxies(self.url))
        self.stream_allowed = transport != "http" and not proxied
        self.transport = transport

    def uses_stream(self) -> bool:
        """Whether calls go to the stream door (``False`` once ``auto`` found the server without one)."""
        if not self.stream_allowed:
            return False
        return self.transport == "stream" or self.connections.no_door is None

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        last: str = ""
        deadline = time.monotonic() + self.timeout
        route = stream_route(method, path)
        for attempt in range(self.retries + 1):
            pause = self.backoff * 2 ** (attempt - 1) if attempt else 0.0
            left = deadline - time.monotonic() - pause
            if left <= 0:  # no time left for another attempt
                raise ServerUnavailableError(
                    None,
                    f"env server at {self.url} did not answer {method} {path} within "
                    f"timeout={self.timeout:g} s (one deadline for the call and its retries; last attempt: "
                    f"{last or 'none'})",
                )
            if pause:
                time.sleep(pause)
            try:
                if route is not None and self.uses_stream():
                    status, answer = self._stream_attempt(route, body, time.monotonic() + left)
                else:
                    status, answer = self._http_attempt(method, path, body, time.monotonic() + left)
            except _AttemptFailed as exc:
                last = str(exc)
                continue
            if status in _RETRY_STATUSES:
                last = f"HTTP {status}: {self._message(answer)}"
                continue
            if status >= 400:  # the server's message, and where it came from
                message = f"{self._message(answer)} ({method} {self.url}{path})"
                if status in (404, 410) and path.startswith("/instances/"):
                    raise InstanceLostError(status, message)
                raise RemoteEnvError(status, message)
            return answer
        raise ServerUnavailableError(
            None, f"env server at {self.url} is unavailable after {self.retries + 1} attempts ({last})"
        )

    def _stream_attempt(self, route: tuple[str, str | None], body: dict | None, deadline: float) -> tuple:
        """One call on the stream door: ``(status, answer)``; raises :class:`_AttemptFailed` (``auto``: a
        server without the door answers on the HTTP routes instead)."""
        op, instance_id = route
        message = {"op": op, "body": body or {}}
        if instance_id is not None:
            message["instance_id"] = instance_id
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii")
        try:
            answer = json.loads(self.connections.stream.exchange(payload, deadline))
        except HandshakeRefused as exc:
            no_door = exc.status < 400 or exc.status in _NO_STREAM_DOOR
            if no_door and self.transport == "auto":
                self.connections.no_door = f"HTTP {exc.status}: {exc.message}"
                raise _AttemptFailed(
                    f"no stream door ({self.connections.no_door}); the HTTP routes next"
                ) from exc
            if no_door:
                return 501, {"error": f"the server has no stream door (HTTP {exc.status}: {exc.message})"}
            return exc.status, {"error": exc.message}
        except TLSFailed as exc:
            raise _tls_failure(self.url, str(exc)) from exc
        except ExchangeFailed as exc:
            cause = exc.cause
            if isinstance(cause, ConnectionClosed) and cause.code == CLOSE_TOO_BIG:
                return 413, {"error": f"the message is too large for the server ({cause})"}
            if isinstance(cause, ProtocolError) and cause.code == CLOSE_TOO_BIG:  # an answer too big for us
                raise RemoteEnvError(
                    None, f"env server at {self.url} answered {op} with {cause.reason} (this client's limit)"
                ) from exc
            raise _AttemptFailed(f"{type(cause).__name__}: {cause}") from exc
        except (OSError, DeadlineExceeded) as exc:  # no connection: nothing was sent
            raise _AttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # an answer that is not JSON
            raise RemoteEnvError(
                None, f"env server at {self.url} answered {op} with a message that is not JSON"
            ) from exc
        return answer["status"], answer["body"]

    def _http_attempt(self, method: str, path: str, body: dict | None, deadline: float) -> tuple:
        """One HTTP request: ``(status, answer)``; raises :class:`_AttemptFailed`."""
        pool = self.connections.http
        try:
            connection = pool.connect(deadline)
        except DeadlineExceeded as exc:
            raise _AttemptFailed(str(exc)) from exc
        try:
            response = connection.session.request(
                method, self.url + path, json=body, deadline=deadline - time.monotonic()
            )
        except requests.exceptions.SSLError as exc:
            pool.discard(connection)
            raise _tls_failure(self.url, f"the TLS handshake failed ({exc})") from exc
        except requests.RequestException as exc:
            pool.discard(connection)
            raise _AttemptFailed(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            pool.discard(connection)
            raise
        pool.give_back(connection)
        try:
            return response.status_code, response.json()
        except ValueError:  # a proxy's error page, or an answer cut short
            if response.status_code >= 400:
                return response.status_code, {"error": response.text[:500]}
            raise RemoteEnvError(
                response.status_code,
                f"env server at {self.url} answered {method} {path} with a body that is not JSON: "
                f"{response.text[:200]!r}",
            ) from None

    @staticmethod
    def _message(answer: Any) -> str:
        if isinstance(answer, dict):
            return str(answer.get("error", answer))
        return str(answer)[:500]


class RemoteEnv(gym.Env[str, str]):
    """An env instance on an env server, as a Gymnasium env (see the module docstring).

    Args:
        url: The server, e.g. ``http://127.0.0.1:8000``.
        env_id: The hosted env (``progpo/ALFWorld-v0``, ``progpo/WebShop-v0``, ...).
        timeout: Seconds one call (reset, step, ...) may take in all, its retries included: a wall-clock
            deadline, not a per-read timeout.
        connect_timeout: Seconds to wait for a connection.
        retries: Extra attempts for retryable failures.
        backoff: First back-off in seconds (doubles per attempt).
        token: The client token the server's operator gave this client (sent as ``Authorization: Bearer``;
            default ``$PROGPO_CLIENT_TOKEN``; none: the server counts this client as its host).
        transport: ``"auto"`` (the stream door where the server has one, else the HTTP routes), ``"stream"``
            or ``"http"`` (see the module docstring).
        render_mode: ``"ansi"`` or ``None``.
        **env_kwargs: Constructor kwargs of the hosted env (the server's allow-list applies). With
            ``expert=True`` (allowed where the operator turned the expert on) each info gets the expert's
            next command, ``info["expert_action"]``, as in process: the server's answers never carry it, so
            this env reads it from its own route after every reset and step.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        url: str,
        env_id: str,
        *,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.2,
        token: str | None = None,
        transport: str = "auto",
        render_mode: str | None = None,
        **env_kwargs: Any,
    ):
        if env_id == REMOTE_ENV_ID:
            raise ValueError("a remote env cannot host another remote env")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.env_id = env_id
        self._client = _Client(url, timeout, connect_timeout, retries, backoff, token, transport)
        # the key makes the create safe to send again: a server that made the instance answers the retry
        # with it instead of making a second one
        create = {
            "env_id": env_id,
            "kwargs": encode(env_kwargs),
            "idempotency_key": secrets.token_urlsafe(16),
        }
        meta = self._client.request("POST", "/instances", create)
        self.instance_id: str | None = meta["instance_id"]
        self.num_tasks: int | None = meta.get("num_tasks")
        self.max_steps: int | None = meta.get("max_steps")
        self.max_action_length = int(meta.get("max_action_length", MAX_ACTION_LENGTH))
        if isinstance(meta.get("prompt_style"), str):  # the hosted env's, for the client's prompts
            self.metadata = {**type(self).metadata, "prompt_style": meta["prompt_style"]}
        self.observation_space = Unicode(int(meta.get("max_observation_length", MAX_OBSERVATION_LENGTH)))
        self.action_space = Unicode(self.max_action_length, min_length=1)
        self._seq = 0
        self._steps = 0
        self._observation: str | None = None
        self._expert = bool(env_kwargs.get("expert"))

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._client.url

    def _path(self, suffix: str = "") -> str:
        if self.instance_id is None:
            raise gym.error.ClosedEnvironmentError("the remote env is closed")
        return f"/instances/{self.instance_id}{suffix}"

    def _mutate(self, suffix: str, body: dict[str, Any]) -> dict:
        """A reset/step numbered ``seq`` (safe to retry); a call the server refused does not use a number."""
        body["seq"] = self._seq + 1
        try:
            answer = self._client.request("POST", self._path(suffix), body)
        except RemoteEnvError as exc:
            if exc.status is None:  # no answer: the server may have acted, so the number is spent
                self._seq += 1
            raise
        self._seq += 1
        return answer

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Reset the remote instance (same seed → same task and observation as in-process)."""
        super().reset(seed=seed)
        body = {"seed": seed, "options": encode(options) if options is not None else None}
        return self._apply_reset(self._mutate("/reset", body))

    def _apply_reset(self, answer: dict) -> tuple[str, dict]:
        self._observation, self._steps = answer["observation"], 0
        return answer["observation"], self._with_expert(decode(answer["info"]))

    def _with_expert(self, info: dict) -> dict:
        if self._expert:
            info["expert_action"] = self.expert_action()
        return info

    def expert_action(self) -> str | None:
        """The expert's next command (``None`` once it has none), from the server's expert route: where the
        operator turned the expert on (else :class:`RemoteEnvError`, 409)."""
        return self._client.request("GET", self._path("/expert"))["expert_action"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Step the remote instance; a non-string action is sent as an invalid action, as in-process."""
        try:
            answer = self._mutate("/step", {"action": action if isinstance(action, str) else None})
        except RemoteEnvError as exc:
            if exc.status == 409 and "reset" in exc.message:
                raise gym.error.ResetNeeded(exc.message) from None
            raise
        return self._apply_step(answer)

    def _apply_step(self, answer: dict) -> tuple[str, float, bool, bool, dict]:
        self._observation = answer["observation"]
        self._steps += 1
        return (
            answer["observation"],
            float(decode(answer["reward"])),
            bool(answer["terminated"]),
            bool(answer["truncated"]),
            self._with_expert(decode(answer["info"])),
        )

    def available_actions(self) -> Any:
        """The env's current admissible/available actions (from the last info)."""
        return decode(self._client.request("GET", self._path("/available_actions"))["available_actions"])

    def render(self) -> str | None:
        """The last observation (``render_mode="ansi"``)."""
        return self._observation if self.render_mode == "ansi" else None

    @property
    def elapsed_steps(self) -> int:
        """Actions taken in the current episode."""
        return self._steps

    def close(self) -> None:
        """Close the remote instance (quietly if it is already gone or the server is down)."""
        if getattr(self, "instance_id", None) is None:
            return
        try:
            self._client.request("DELETE", self._path())
        except RemoteEnvError:
            pass  # expired, lost with its worker, or the server is gone: nothing left to close
        finally:
            self.instance_id = None


def _unwrap_remote(env: gym.Env) -> RemoteEnv:
    remote = env.unwrapped
    if not isinstance(remote, RemoteEnv):
        raise TypeError(f"expected a RemoteEnv, got {type(remote).__name__}")
    return remote


def _batch(kind: str, remotes: list[RemoteEnv], bodies: list[dict[str, Any]], apply) -> list[Any]:
    """One ``/batch/<kind>`` request per server; ``apply(remote, answer)`` turns each answer into a result."""
    by_url: dict[str, list[int]] = {}
    for position, remote in enumerate(remotes):
        by_url.setdefault(remote.url, []).append(position)
    results: list[Any] = [None] * len(remotes)
    failures = []
    statuses: dict[int, int | None] = {}  # position -> the HTTP status of its failure
    for positions in by_url.values():
        while positions:  # items the server did not run (its answer was full) go again
            items = [
                {
                    **bodies[p],
                    "instance_id": remotes[p]._path()[len("/instances/") :],
                    "seq": remotes[p]._seq + 1,
                }
                for p in positions
            ]
            key = "steps" if kind == "step" else "resets"
            answers = remotes[positions[0]]._client.request("POST", f"/batch/{kind}", {key: items})["results"]
            not_run = []
            for p, answer in zip(positions, answers, strict=True):
                if answer["ok"]:
                    remotes[p]._seq += 1
                    results[p] = apply(remotes[p], answer)
                elif answer.get("not_run"):
                    not_run.append(p)
                else:
                    failures.append(f"env {p}: [{answer['status']}] {answer['error']}")
                    statuses[p] = answer["status"]
            if len(not_run) == len(positions):
                failures += [f"env {p}: the server ran none of the batch's items" for p in not_run]
                statuses.update(dict.fromkeys(not_run, 413))
                break
            positions = not_run
    if failures:
        servers = ", ".join(sorted({remote.url for remote in remotes}))
        error = RemoteEnvError(None, f"batch {kind} on {servers} failed for " + "; ".join(failures))
        error.results = results  # type: ignore[attr-defined]
        error.statuses = statuses  # type: ignore[attr-defined]
        raise error
    return results


def step_batch(envs: Sequence[gym.Env], actions: Sequence[Any]) -> list[tuple[str, float, bool, bool, dict]]:
    """Step several remote envs with one request per server; results in order.

    Args:
        envs: Remote envs (``gymnasium.make("progpo/Remote-v0", ...)`` or :class:`RemoteEnv`).
        actions: One action per env.

    Raises:
        RemoteEnvError: If any item failed (the others are applied; their results are in ``exc.results``,
            the failed items' HTTP statuses in ``exc.statuses``, by position).
    """
    if len(envs) != len(actions):
        raise ValueError(f"expected {len(envs)} actions, got {len(actions)}")
    bodies = [{"action": action if isinstance(action, str) else None} for action in actions]
    return _batch("step", [_unwrap_remote(env) for env in envs], bodies, RemoteEnv._apply_step)


def reset_batch(
    envs: Sequence[gym.Env], seeds: Sequence[int | None], options: Sequence[dict[str, Any] | None]
) -> list[tuple[str, dict]]:
    """Reset several remote envs with one request per server (same results as resetting each)."""
    remotes = [_unwrap_remote(env) for env in envs]
    if not len(remotes) == len(seeds) == len(options):
        raise ValueError("reset_batch needs one seed and one options entry per env")
    for remote, seed in zip(remotes, seeds, strict=True):
        gym.Env.reset(remote, seed=seed)  # the client-side RNG, as RemoteEnv.reset does
    bodies = [
        {"seed": seed, "options": encode(opts) if opts is not None else None}
        for seed, opts in zip(seeds, options, strict=True)
    ]
    return _batch("reset", remotes, bodies, RemoteEnv._apply_reset)


class _BatchedRemoteBackend:
    """The ``"sync"`` backend of :class:`RemoteGroupVectorEnv` (a
    :class:`~progpo_envs.core.worker_protocol.VectorBackend`): a reset or step of many copies is one request
    per server."""

    def __init__(self, envs: list[RemoteEnv]):
        self.envs = envs

    def _some(self, copies: Sequence[int] | None) -> list[RemoteEnv]:
        return self.envs if copies is None else [self.envs[i] for i in copies]

    def reset(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        copies: Sequence[int] | None = None,
    ) -> list[tuple[str, dict]]:
        return reset_batch(self._some(copies), seeds, options)

    def step(
        self, actions: Sequence[Any], copies: Sequence[int] | None = None
    ) -> list[tuple[str, float, bool, bool, dict]]:
        return step_batch(self._some(copies), actions)

    def call(self, name: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        return [apply_command(env, Call(name, args, kwargs or {})) for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RemoteGroupVectorEnv(GroupVectorEnv):
    """``make_vec``'s group vector env for ``progpo/Remote-v0``: one request per server for each vector step.

    It is the group vector env of any text env, except that stepping or resetting all copies (or a group of
    them) is one batch request per server instead of one request per copy.

    Args:
        num_envs: Total copies (``B·G``).
        group_size: Copies per task group.
        vector_mode: ``"sync"`` (batched requests from this process) or ``"async"`` (copies in subprocesses,
            one request per copy, as for any text env).
        **kwargs: ``url``, ``env_id`` and the rest of :class:`RemoteEnv`'s arguments; ``num_workers`` and
            ``mp_context`` for ``"async"``.

    Example:
        >>> envs = gym.make_vec("progpo/Remote-v0", num_envs=8, group_size=4, url=url,
        ...                     env_id="progpo/ALFWorld-v0")  # doctest: +SKIP
    """

    def __init__(
        self,
        num_envs: int = 1,
        group_size: int = 1,
        vector_mode: VectorMode | str = VectorMode.SYNC,
        **kwargs: Any,
    ):
        super().__init__(
            f"{__name__}:RemoteEnv",
            num_envs=num_envs,
            group_size=group_size,
            vector_mode=vector_mode,
            **kwargs,
        )

    def make_backend(
        self, entry_point: str, env_kwargs: dict[str, Any], num_workers: int | None, mp_context: str | None
    ) -> VectorBackend:
        """``"sync"``: the copies as :class:`RemoteEnv` s in this process, stepped with batch requests;
        ``"async"``: the group vector env's own subprocesses."""
        if self.vector_mode is not VectorMode.SYNC:
            return super().make_backend(entry_point, env_kwargs, num_workers, mp_context)
        return _BatchedRemoteBackend([RemoteEnv(**env_kwargs) for _ in range(self.num_envs)])
