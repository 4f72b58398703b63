"""Serving the app with waitress: in the foreground (the CLI) or on a background thread (tests, benchmarks).

Waitress is a pure-Python, multi-threaded WSGI server: its threads only parse HTTP and route to the env
workers, so a few dozen threads serve many concurrent clients. (Gunicorn works too, with a single worker
process and threads, e.g. ``gunicorn -w 1 --threads 32 'progpo_envs.server.cli:app_from_environment()'``:
the instances live in the one process that owns the env workers.)

The env server's channels are also its stream door (:mod:`progpo_envs.server.stream`: ``GET /stream`` as a
WebSocket), so a stream connection counts like any other. Connections are shared fairly and a stop signal
drains, as for the WebShop site (:mod:`webshop_server.serving`: a quarter of the open connections per client
host, idle ones closed after a while).
:func:`serve_until_stopped` drains on SIGTERM and SIGINT, also when sent to the whole process group: the pool
stops restarting workers at once (the workers ignore the group's signal and keep serving), the server stops
accepting, lets the requests in flight finish, then stops the env workers.

Example:
    >>> from progpo_envs.server.app import ServerConfig, create_app
    >>> with BackgroundServer(create_app(ServerConfig())) as server:  # doctest: +SKIP
    ...     print(server.url)
    http://127.0.0.1:49152
"""

from __future__ import annotations

import errno
import socket
import threading

from flask import Flask

from progpo_base.usage import UsageError
from progpo_envs.server.stream import stream_channel_class
from webshop_server.serving import make_server
from webshop_server.serving import serve_until_stopped as serve_app_until_stopped

#: Waitress threads by default: enough for 32 concurrent clients with room for health checks.
DEFAULT_THREADS = 48


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free one), for the server to listen on.

    ``progpo serve`` binds it before anything slow (env workers, loading the env), so a port in use, an
    address that is not this machine's or a privileged port is one line with the fix (:class:`UsageError`)
    within a second, on either door, instead of a traceback after the start-up.
    """
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress and uvicorn set it
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            message = (
                f"port {port} on {host} is in use (another server listens there): stop that server, or give "
                "another --port (--port 0 picks a free one)"
            )
        elif error.errno == errno.EADDRNOTAVAIL:
            message = f"--host {host} is not an address of this machine: give one of its addresses"
        elif error.errno == errno.EACCES:
            message = f"port {port} is privileged (below 1024) and not for this user: give another --port"
        else:
            message = f"cannot listen on {host}:{port}: {error.strerror or error}"
        raise UsageError(message) from None
    except (socket.gaierror, OverflowError) as error:  # a host name that does not resolve; a port > 65535
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {error}") from None
    return sock


def make_wsgi_server(
    app: Flask,
    host: str = "127.0.0.1",
    port: int = 8000,
    threads: int = DEFAULT_THREADS,
    sock: socket.socket | None = None,
):
    """A waitress server for ``app`` (``port=0`` picks a free port: read ``server.effective_port``; ``sock``:
    a socket bound already, :func:`listening_socket`, instead of ``host`` and ``port``); for the env server's
    app its channels also serve the stream door (:mod:`progpo_envs.server.stream`)."""
    server = make_server(app, host=host, port=port, threads=threads, ident="progpo-env-server", sock=sock)
    native = app.extensions.get("progpo_native")
    if native is not None:
        server.channel_class = stream_channel_class(native)
    return server


def serve_until_stopped(server, pool) -> None:
    """Serve until SIGTERM or SIGINT (to this process or its whole group), then drain and stop the env
    workers of ``pool`` (an :class:`~progpo_envs.server.pool.EnvPool`, which stops restarting them as soon as
    the signal comes)."""
    serve_app_until_stopped(server, pool.shutdown, name="env-server", on_signal=pool.stop_restarting)


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
