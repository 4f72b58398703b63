"""Serving the app with waitress: in the foreground (the CLI) or on a background thread (tests, benchmarks).

Waitress is a pure-Python, multi-threaded WSGI server: its threads only parse HTTP and route to the env
workers, so a few dozen threads serve many concurrent clients. (Gunicorn works too, with a single worker
process and threads, e.g. ``gunicorn -w 1 --threads 32 'progpo_envs.server.cli:app_from_environment()'``:
the instances live in the one process that owns the env workers.)

Connections are shared fairly: the server keeps up to :data:`CONNECTION_LIMIT` open (with ``poll``, so past
``select``'s 1024 descriptors), one client address at most :data:`CONNECTIONS_PER_ADDRESS` of them (more are
closed as they are accepted), and idle ones are closed after :data:`IDLE_CONNECTION_TIMEOUT` seconds; so a
client holding idle or half-sent connections cannot starve the health checks. :func:`serve_until_stopped`
drains on SIGTERM: it stops accepting, lets the requests in flight finish, then stops the env workers.

Example:
    >>> from progpo_envs.server.app import ServerConfig, create_app
    >>> with BackgroundServer(create_app(ServerConfig())) as server:  # doctest: +SKIP
    ...     print(server.url)
    http://127.0.0.1:49152
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable

from flask import Flask
from waitress.channel import HTTPChannel
from waitress.server import create_server

#: Waitress threads by default: enough for 32 concurrent clients with room for health checks.
DEFAULT_THREADS = 48
#: Open connections at most (keep-alive ones included); past it the server stops accepting.
CONNECTION_LIMIT = 1024
#: Open connections one client address may hold: a quarter of the limit, far above any one trainer's need.
CONNECTIONS_PER_ADDRESS = CONNECTION_LIMIT // 4
#: Seconds a connection with no request in flight may stay silent before it is closed.
IDLE_CONNECTION_TIMEOUT = 30
#: Seconds a SIGTERM waits for the requests in flight (a container's stop grace period is 10 s by default).
DRAIN_TIMEOUT = 8.0


class FairShareChannel(HTTPChannel):
    """Waitress's HTTP channel, closed at once if its address already holds its share of connections."""

    def __init__(self, server, sock, addr, adj, map=None):  # noqa: A002 - waitress's signature
        super().__init__(server, sock, addr, adj, map)
        host = addr[0] if isinstance(addr, tuple) else addr
        held = sum(1 for channel in list(server.active_channels.values()) if channel.addr[0] == host)
        if isinstance(addr, tuple) and held > CONNECTIONS_PER_ADDRESS:
            self.close()


def make_wsgi_server(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: int = DEFAULT_THREADS):
    """A waitress server for ``app`` (``port=0`` picks a free port: read ``server.effective_port``)."""
    server = create_server(
        app,
        host=host,
        port=port,
        threads=threads,
        connection_limit=CONNECTION_LIMIT,
        channel_timeout=IDLE_CONNECTION_TIMEOUT,
        cleanup_interval=5,
        asyncore_use_poll=True,
        ident="progpo-env-server",
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


def serve_until_stopped(server, on_stop: Callable[[], None], drain_timeout: float = DRAIN_TIMEOUT) -> None:
    """Run ``server`` until SIGTERM or SIGINT, then drain: refuse new connections, finish the requests in
    flight (at most ``drain_timeout`` seconds), close, and call ``on_stop`` (stop the env workers)."""
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    loop_map = server._map  # waitress's run() loops over this map; here the loop stops between passes

    def one_pass(timeout: float) -> None:
        server.asyncore.loop(timeout=timeout, map=loop_map, use_poll=True, count=1)

    try:
        while not stopping.is_set():
            one_pass(0.25)
        print("[env-server] stopping: finishing the requests in flight", file=sys.stderr, flush=True)
        server.del_channel()  # no more accepts: new connections are refused, the open ones keep being served
        server.socket.close()
        deadline = time.monotonic() + drain_timeout
        while requests_in_flight(server) and time.monotonic() < deadline:
            one_pass(0.05)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        server.close()
        on_stop()


class BackgroundServer:
    """``app`` served by waitress on a thread of this process, on a free loopback port.

    Args:
        app: The Flask app (``create_app(...)``).
        threads: Waitress threads.
        shutdown_pool: Also stop the app's env workers when the server stops.
    """

    def __init__(self, app: Flask, threads: int = DEFAULT_THREADS, shutdown_pool: bool = True):
        self.app = app
        self.shutdown_pool = shutdown_pool
        self._server = make_wsgi_server(app, port=0, threads=threads)
        self.port = int(self._server.effective_port)
        self.url = f"http://127.0.0.1:{self.port}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="env-server", daemon=True)

    def _serve(self) -> None:
        try:
            self._server.run()
        except (OSError, ValueError):
            # stop() closes the channels from another thread, so the loop's select() can meet a descriptor
            # closed under it (EBADF, or -1: ValueError); while stopping that is the stop itself, not a fault
            # (WebTest's StopableWSGIServer, which also serves waitress on a thread, does the same)
            if not self._stopping.is_set():
                raise

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (and the env workers unless ``shutdown_pool=False``)."""
        self._stopping.set()
        self._server.close()
        # close() stops listening; the loop exits once every channel (open connections, the wake-up trigger)
        # is closed too, so close them rather than wait for their timeouts
        for channel in list(self._server._map.values()):
            channel.close()
        self._thread.join(10)
        pool = self.app.extensions.get("progpo_pool")
        if self.shutdown_pool and pool is not None:
            pool.shutdown()
