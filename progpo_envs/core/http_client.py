"""HTTP requests with a wall-clock deadline: a ``requests.Session`` that no trickling server can hold.

``requests``' ``timeout`` bounds each socket read, not the request: a server (or a broken proxy) that sends
one byte a second resets it with every byte and keeps the caller waiting for ever. :class:`DeadlineSession`
gives every request a total deadline instead. A watchdog timer starts with the request; if the request has not
finished when it fires, the timer shuts down the socket the request is using, so the blocked read returns at
once, and the request raises :class:`DeadlineExceeded` naming the URL and the deadline. Shutting the socket
down from another thread is the one way to wake a blocked ``recv`` (urllib3's ``HTTPResponse.shutdown`` does
the same for a response body; here the wait for the headers is covered too). The connect phase is bounded by
the connect timeout, and each read by the remaining time as well.

The env server's client (:mod:`progpo_envs.server.remote`), the WebShop env's HTTP backend and the test
suite's AgentGym client use it.

Example:
    >>> session = DeadlineSession(deadline=5.0)
    >>> session.deadline
    5.0
    >>> session.get("http://127.0.0.1:9/never", deadline=0.5)  # doctest: +SKIP
    Traceback (most recent call last):
    requests.exceptions.ConnectionError: ...
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class DeadlineExceeded(requests.Timeout):
    """A request that had not finished (headers and body) when its deadline passed."""


class _Watch:
    """The deadline of one request in progress: the connections it used, shut down when the timer fires."""

    def __init__(self, seconds: float):
        self._lock = threading.Lock()
        self._connections: list[HTTPConnection] = []
        self._finished = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def add(self, connection: HTTPConnection) -> None:
        with self._lock:
            self._connections.append(connection)

    def _fire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.fired = True
            for connection in self._connections:
                sock = connection.sock
                if sock is None:
                    continue
                try:  # the base class's shutdown also for a TLS socket: it only wakes the blocked read
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed

    def finish(self) -> None:
        with self._lock:
            self._finished = True
        self._timer.cancel()


_current = threading.local()


class _WatchedConnection:
    """Mixin of the connection classes: a request sent on the connection is put under the thread's watch."""

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.add(self)  # type: ignore[arg-type]
        super().request(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_WatchedConnection, HTTPConnection):
    pass


class _HTTPSConnection(_WatchedConnection, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _DeadlineAdapter(HTTPAdapter):
    """``requests``' adapter with connections that the thread's watch can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


class DeadlineSession(requests.Session):
    """A ``requests.Session`` whose every request finishes or fails within ``deadline`` seconds.

    Args:
        deadline: Seconds a request may take in all (connect, send, headers and body); a call may pass its
            own ``deadline=``.
        connect_timeout: Seconds to wait for the connection (at most the deadline).
        pool_maxsize: Connections kept per host (``requests``' ``HTTPAdapter`` setting).
    """

    def __init__(self, deadline: float, connect_timeout: float = 5.0, pool_maxsize: int = 10):
        super().__init__()
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
        self.deadline = float(deadline)
        self.connect_timeout = float(connect_timeout)
        for prefix in ("http://", "https://"):
            self.mount(prefix, _DeadlineAdapter(pool_maxsize=pool_maxsize))

    def request(self, method: str, url: str, *args: Any, deadline: float | None = None, **kwargs: Any):
        """``requests.Session.request`` within ``deadline`` seconds (default: the session's).

        Raises:
            DeadlineExceeded: The request had not finished in time (a ``requests.Timeout``).
        """
        seconds = self.deadline if deadline is None else float(deadline)
        kwargs["timeout"] = (min(self.connect_timeout, seconds), seconds)
        kwargs.pop("stream", None)  # the body is read here, under the deadline
        previous = getattr(_current, "watch", None)
        watch = _current.watch = _Watch(seconds)
        started = time.monotonic()
        try:
            return super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            if watch.fired or time.monotonic() - started >= seconds:
                raise DeadlineExceeded(
                    f"{method} {url} did not finish within its {seconds:g} s deadline"
                ) from exc
            raise
        finally:
            watch.finish()
            _current.watch = previous
