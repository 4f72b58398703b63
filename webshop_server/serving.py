"""Serving a WSGI app with waitress, as both servers do (the WebShop site and the env server).

Waitress reads each request in full on its event loop before a worker thread sees it, so slow or idle clients
cost a connection, never a thread. What is left to share fairly is the connections: the server keeps up to
``connection_limit`` open (with ``poll``, so past ``select``'s 1,024 descriptors), one client host at most a
quarter of them (:class:`FairShareChannel`; a host as :func:`~webshop_server.clients.client_host` counts it,
so several loopback or IPv6 addresses of one host are one client), and a connection with nothing in flight is
closed after ``channel_timeout`` seconds; so one client holding idle or half-sent connections cannot starve
the others or the health checks. A host's connection past its share closes the host's oldest connection with
no request in flight (idle, or a request half sent), or itself when every one has a request in flight
(:func:`connection_to_close`): the host's own next request, a health check among them, gets through its
share's stale connections instead of being locked out behind them. A connection whose first byte opens a TLS
handshake (a client given ``https://`` for this plain-HTTP server) is answered 400 in plain HTTP and closed,
so the client's TLS fails at once instead of waiting out its deadline.

The same rules serve the env server's OpenEnv door (:mod:`progpo_envs.server.uvicorn_serving`), with the same
numbers, and the two share the rest of this module: the open-file limit raised to what the connections need
(:func:`raise_open_file_limit`: a server out of descriptors cannot accept a health check either), and
:class:`FloodFilter` on the servers' loggers, so a fault that repeats at every accept (``Too many open
files``) is logged once per :data:`LOG_INTERVAL` seconds with a count, not thousands of tracebacks a second.
And a server's memory stays flat under traffic for as long as it runs: a connection's out-buffer does not
keep what it sent (:data:`OUTBUF_RECYCLE_BYTES`), and the process's malloc arenas are capped
(:func:`limit_malloc_arenas`).

:func:`serve_until_stopped` drains on SIGTERM and SIGINT, also when the signal goes to the whole process group
(Ctrl-C in a terminal, ``systemd``'s default ``KillMode=control-group``, ``kill -TERM -PGID``): it stops
accepting at once, tells each connection it is going away (:meth:`FairShareChannel.going_away`), lets the
requests in flight finish (at most ``drain_timeout`` seconds: a container's stop
grace period is 10 s by default), then closes and calls ``on_stop``. Helper processes of a server ignore
these signals and are stopped by it (the env server's workers, see ``progpo_envs.server.pool``).

Example:
    >>> from flask import Flask
    >>> server = make_server(Flask("demo"), port=0, threads=2, ident="demo")
    >>> int(server.effective_port) > 0
    True
    >>> server.close()
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from waitress.buffers import OverflowableBuffer
from waitress.channel import HTTPChannel
from waitress.server import create_server

from progpo_base.glibc import glibc_function
from webshop_server.clients import client_host

#: Open connections at most (keep-alive ones included); past it the server stops accepting.
CONNECTION_LIMIT = 1024
#: Seconds a connection with no request in flight may stay silent before it is closed.
IDLE_CONNECTION_TIMEOUT = 30
#: Seconds a server waits for the rest of a request it started to read (gunicorn: for its next bytes; the
#: OpenEnv door: for the rest of its head, then for each part of its body) before it drops the connection.
READ_TIMEOUT = 10.0
#: Seconds a stop signal waits for the requests in flight.
DRAIN_TIMEOUT = 8.0
#: The signals that stop a server (with a drain).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


#: The first byte of a TLS handshake (a record of content type 22): what an https:// client sends first.
TLS_HANDSHAKE = b"\x16"

#: glibc malloc arenas of a server process (:func:`limit_malloc_arenas`), and mallopt's parameter for them.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8
#: Bytes a connection's out-buffer may have carried before, once all of it is sent, it is replaced (waitress
#: would keep them until 16 MiB: :meth:`FairShareChannel._flush_some`).
OUTBUF_RECYCLE_BYTES = 1 << 20
#: Seconds between two log records of one kind (:class:`FloodFilter`).
LOG_INTERVAL = 10.0
#: Descriptors a server keeps beyond its connections: listening sockets, env workers' pipes, files, imports.
RESERVED_FILES = 256


def connections_per_host(connection_limit: int) -> int:
    """Open connections one client host may hold: a quarter of the limit, far above any one client's need."""
    return max(1, connection_limit // 4)


def connection_to_close(newcomer: Any, connections: Iterable[Any], share: int, idle: Callable[[Any], bool]):
    """The connection to close so that ``newcomer``'s host holds at most ``share`` open connections: ``None``
    within the share, else the host's oldest connection for which ``idle`` holds (no request in flight:
    silent, or a request half sent; ``newcomer`` counts as idle), so ``newcomer`` itself when all the others
    are busy. A connection has ``host`` (its client host) and ``opened`` (a monotonic time)."""
    mine = [c for c in connections if c.host == newcomer.host]
    if newcomer not in mine:
        mine.append(newcomer)
    if len(mine) <= share:
        return None
    candidates = [c for c in mine if c is newcomer or idle(c)]
    return min(candidates, key=lambda c: c.opened)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap this process's glibc malloc arenas at ``arenas`` (``mallopt(M_ARENA_MAX)``); whether the cap was
    set (not on another C library, nor where ``MALLOC_ARENA_MAX`` is in the environment: the operator's
    choice). glibc gives threads arenas of their own, up to 8 per core, and a server's threads (waitress's 48)
    spread their short-lived allocations over them, whose freed pages are seldom given back: the soak's
    servers crept up by ~1 MiB a minute under WebShop traffic, with no Python object left behind
    (``tracemalloc`` flat). With 2 arenas the same traffic leaves the RSS flat; the GIL serialises those
    threads anyway."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = glibc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1


class HeapTrimmer:
    """Hands the free pages of glibc's heap back to the system (``malloc_trim(0)``) at most once every
    ``interval_s`` seconds, when :meth:`tick` is called; on another C library it does nothing.

    A long-lived process whose C allocations change size as it goes keeps its heap at the largest it ever was:
    an ALFWorld env worker's instances each load a new game's planner task (``libdownward``, C++) on every
    reset, so its heap holds 10-20 MiB of freed pages that grow with every larger task it meets. A trim takes
    1-3 ms for such a heap (measured on a 60 MiB heap), so once every 10 s costs nothing that shows.
    """

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self._last = time.monotonic()
        self._malloc_trim = glibc_function("malloc_trim", [ctypes.c_size_t])

    def tick(self) -> bool:
        """Trim when ``interval_s`` has passed since the last trim (or since the trimmer was made); whether
        it trimmed."""
        now = time.monotonic()
        if self._malloc_trim is None or now - self._last < self.interval_s:
            return False
        self._malloc_trim(0)
        self._last = time.monotonic()
        return True


def raise_open_file_limit(needed: int) -> int:
    """Raise this process's soft limit on open files to ``needed`` (at most its hard limit); the soft limit
    after. A one-line warning on stderr when the hard limit is lower: ``ulimit -n`` (or a container's
    ``nofile`` ulimit) then caps the connections before the server's limits do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        print(
            f"warning: this process may open {soft} files, fewer than the {needed} its connections may need: "
            "raise the limit (ulimit -n, a container's nofile ulimit)",
            file=sys.stderr,
            flush=True,
        )
    return soft


class FloodFilter(logging.Filter):
    """Lets one record of each kind through every ``interval`` seconds and counts the others; the next one let
    through says how many were left out. A kind is the logger, the level, the message's first line and the
    exception's type, so a fault that repeats (``Too many open files`` at every accept) is one line a while,
    and distinct faults all show.

    Args:
        interval: Seconds between two records of one kind.
    """

    #: Kinds remembered at most (a flood of distinct messages starts the count again rather than grow).
    MAX_KINDS = 1024

    def __init__(self, interval: float = LOG_INTERVAL):
        super().__init__()
        self.interval = interval
        self._last: dict[tuple, float] = {}
        self._left_out: Counter[tuple] = Counter()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        first_line = str(record.msg).split("\n", 1)[0][:200]
        kind = (record.name, record.levelno, first_line, record.exc_info[0] if record.exc_info else None)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._left_out[kind] += 1
                return False
            if len(self._last) >= self.MAX_KINDS:
                self._last.clear()
            self._last[kind] = now
            left_out = self._left_out.pop(kind, 0)
        if left_out:
            record.msg = f"{record.msg}\n({left_out} more like it in the last {now - last:.0f} s left out)"
        return True


#: The one filter of this process's server loggers (:func:`quiet_floods`).
FLOODS = FloodFilter()


def quiet_floods(*names: str) -> None:
    """Put :data:`FLOODS` on the loggers ``names`` (once each)."""
    for name in names:
        logger = logging.getLogger(name)
        if FLOODS not in logger.filters:
            logger.addFilter(FLOODS)


class FairShareChannel(HTTPChannel):
    """Waitress's HTTP channel, counted in its client host's share of connections as it is accepted: past the
    share it closes the host's oldest idle connection, or itself (:func:`connection_to_close`).

    The room is made before the channel is registered (in :meth:`add_channel`, which waitress's constructor
    calls), so at no instant does the server's table of open connections (``active_channels``, which another
    thread may read: the drain, ``/metrics``, a test) hold more than a host's share: registered first and
    trimmed after, the table briefly held share + 1 while each connection past the share was accepted.
    """

    def __init__(self, server, sock, addr, adj, map=None):  # noqa: A002 - waitress's signature
        self.host = client_host(addr[0]) if isinstance(addr, tuple) else None
        self.opened = time.monotonic()
        self.addr = addr  # waitress sets it after registering the channel: a reader of the table needs it
        self._refused = False
        self._heard = False  # whether any byte came yet
        super().__init__(server, sock, addr, adj, map)
        if self._refused:  # every other connection of its host is busy: this one goes, never registered
            self.handle_close()

    def received(self, data: bytes) -> bool:
        if not self._heard:
            self._heard = True
            if data[:1] == TLS_HANDSHAKE:  # a client that took this http:// server for https://
                self._refuse_tls()
                return False
        return super().received(data)

    def _refuse_tls(self) -> None:
        """Answer a TLS handshake in plain HTTP and close: the client's TLS fails at once on these bytes
        (instead of waiting out its deadline for a server that waits for the end of a request head)."""
        body = b'{"error": "this server speaks plain HTTP: use http://, not https://"}'
        answer = (
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        with self.outbuf_lock:
            self.outbufs[-1].append(answer)
            self.current_outbuf_count += len(answer)
            self.total_outbufs_len += len(answer)
        self.close_when_flushed = True

    def add_channel(self, map=None) -> None:  # noqa: A002 - wasyncore's signature
        if self.host is not None:
            channels = [c for c in list(self.server.active_channels.values()) if hasattr(c, "opened")]
            share = connections_per_host(self.adj.connection_limit)
            victim = connection_to_close(self, channels, share, _idle)
            if victim is self:
                self._refused = True
                return
            if victim is not None:
                victim.handle_close()
        super().add_channel(map)

    def going_away(self) -> None:
        """The server is stopping: say so to the peer where the protocol can (an HTTP connection is simply
        closed once its request is answered; the env server's stream door sends a WebSocket close)."""

    def _flush_some(self, do_close: bool = True) -> bool:
        sent = super()._flush_some(do_close=do_close)
        # Waitress's out-buffer keeps the bytes it sent (a BytesIO read forward, never cut) until
        # outbuf_high_watermark (16 MiB) has gone through it; so every long-lived connection (a pooled
        # keep-alive one, a stream door's) held up to 16 MiB of answers long sent, and a server's memory grew
        # with its traffic. Once everything is out, a buffer past OUTBUF_RECYCLE_BYTES starts afresh.
        if not self.total_outbufs_len and self.current_outbuf_count >= OUTBUF_RECYCLE_BYTES:
            self.outbufs[-1].close()
            self.outbufs[-1] = OverflowableBuffer(self.adj.outbuf_overflow)
            self.current_outbuf_count = 0
        return sent


def _idle(channel: HTTPChannel) -> bool:
    """No request of ``channel`` is in flight: nothing received in full and unanswered, nothing to write (a
    request half sent is idle: it is still being read)."""
    return not channel.requests and not channel.total_outbufs_len


def make_server(
    app,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    threads: int,
    ident: str,
    connection_limit: int = CONNECTION_LIMIT,
    sock=None,
):
    """A waitress server for ``app`` with fair-share channels (``port=0`` picks a free port: read
    ``server.effective_port``; ``sock``: a socket bound already, served instead of ``host`` and ``port``); the
    open-file limit raised for ``connection_limit`` connections, the malloc arenas capped
    (:func:`limit_malloc_arenas`), and waitress's log quieted (:func:`quiet_floods`)."""
    raise_open_file_limit(connection_limit + RESERVED_FILES)
    limit_malloc_arenas()  # before waitress starts its threads
    quiet_floods("waitress", "waitress.queue")
    where = {"sockets": [sock]} if sock is not None else {"host": host, "port": port}
    server = create_server(
        app,
        **where,
        threads=threads,
        connection_limit=connection_limit,
        channel_timeout=IDLE_CONNECTION_TIMEOUT,
        cleanup_interval=5,
        asyncore_use_poll=True,
        ident=ident,
    )
    server.channel_class = FairShareChannel
    return server


def requests_in_flight(server) -> int:
    """Connections of ``server`` with a request received and not yet answered in full."""
    return sum(
        1
        for channel in list(server.active_channels.values())
        if channel.requests or channel.total_outbufs_len
    )


def serve_until_stopped(
    server,
    on_stop: Callable[[], None] = lambda: None,
    *,
    name: str,
    drain_timeout: float = DRAIN_TIMEOUT,
    on_signal: Callable[[], None] = lambda: None,
) -> None:
    """Run ``server`` until SIGTERM or SIGINT, then drain: call ``on_signal`` (e.g. stop restarting helpers),
    refuse new connections, finish the requests in flight (at most ``drain_timeout`` seconds), close, and call
    ``on_stop``. ``name`` prefixes the log line."""
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in STOP_SIGNALS}
    loop_map = server._map  # waitress's run() loops over this map; here the loop stops between passes

    def one_pass(timeout: float) -> None:
        server.asyncore.loop(timeout=timeout, map=loop_map, use_poll=True, count=1)

    try:
        while not stopping.is_set():
            one_pass(0.25)
        on_signal()
        print(f"[{name}] stopping: finishing the requests in flight", file=sys.stderr, flush=True)
        server.del_channel()  # no more accepts: new connections are refused, the open ones keep being served
        server.socket.close()
        for channel in list(server.active_channels.values()):
            if isinstance(channel, FairShareChannel):
                channel.going_away()
        deadline = time.monotonic() + drain_timeout
        while requests_in_flight(server) and time.monotonic() < deadline:
            one_pass(0.05)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        server.close()
        on_stop()
