"""Serving the site with gunicorn's pre-forked workers, with the protections of the waitress server.

``progpo webshop serve --server gunicorn`` forks ``--workers`` processes after the catalog and index are
loaded (copy-on-write) and serves from all of them. Gunicorn's ``gthread`` worker gives a thread to a
connection for as long as it takes to read a request, so a client sending requests slowly could hold every
thread; and gunicorn's own Ctrl-C is a quick stop. This module changes both:

* :class:`FairThreadWorker` holds each client host (:func:`~webshop_server.clients.client_host`) to half of
  a worker's threads (its other requests wait, ready, for one of its threads to free: nothing is refused) and
  to a quarter of a worker's connections (more are closed as they are accepted), and gives up on a request
  whose next bytes take more than :data:`~webshop_server.serving.READ_TIMEOUT` seconds from when it was ready
  (accepted, or readable again after an answer), however long it waited for one of its host's threads, and
  closes such a connection at once, where gunicorn's graceful close lingers 2 s for the client on the worker's
  loop (before, one host's 8 half-sent requests were dropped after 10 to 32 s, each waiting for a thread
  before its 10 s began, and each drop stalled the worker 2 s: another host's health check took up to 6 s);
  so one client's slow or idle connections cost that client, not everyone; its log gets one traceback of a
  kind per :data:`~webshop_server.serving.LOG_INTERVAL` seconds;
* SIGINT is a drain, as SIGTERM is, also when sent to the whole process group (Ctrl-C, ``systemd``'s
  ``KillMode=control-group``): the workers ignore SIGINT, and the master (:class:`DrainingArbiter`) stops them
  gracefully, so the requests in flight finish (at most :data:`~webshop_server.serving.DRAIN_TIMEOUT` s) and
  no worker is started again once the stop began (gunicorn's master stops managing workers when it stops).

Gunicorn's worker internals are used as they are in the locked release (``requirements/lock.txt``); the tests
(``tests/webshop_server/test_site_serving.py``) check the behaviour through the command line.
"""

from __future__ import annotations

import errno
import gc
import signal
import sys
import time
from collections import Counter, deque

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers.gthread import TConn, ThreadWorker

from webshop_server.clients import client_host
from webshop_server.serving import DRAIN_TIMEOUT, READ_TIMEOUT, connections_per_host, quiet_floods

#: Threads of each worker process.
THREADS = 4
#: Seconds a request that waited for a thread past its read deadline still gets for bytes on their way.
LATE_READ_GRACE = 1.0


class _Conn(TConn):
    """gunicorn's connection, with a read deadline and a hook when it closes (the worker counts per host)."""

    def __init__(self, cfg, sock, client, server, on_close):
        super().__init__(cfg, sock, client, server)
        self.host = client_host(client[0] if isinstance(client, tuple) else None)
        self._on_close = on_close
        self.ready_at = time.monotonic()  # when its request became ready to read (the worker updates it)
        self.queued = False  # waiting for one of its host's threads

    def init(self):
        """Before each request is read (gunicorn calls this every time): the time left of its deadline, at
        least :data:`LATE_READ_GRACE` (bytes already received are read at once whatever the timeout)."""
        super().init()
        now = time.monotonic()
        timeout = max(READ_TIMEOUT - (now - self.ready_at), LATE_READ_GRACE)
        self.sock.settimeout(timeout)
        self.read_deadline = now + timeout
        self.handled = False  # the worker sets it once the request is read in full

    def close(self, graceful=False):
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None
        if graceful and not getattr(self, "handled", True) and time.monotonic() >= self.read_deadline:
            # a request that never came in full: nothing was answered, so nothing to linger for (gunicorn's
            # graceful close waits up to 2 s for the client on the worker's loop, one connection at a time)
            graceful = False
        super().close(graceful)


class FairThreadWorker(ThreadWorker):
    """gunicorn's ``gthread`` worker with per-host shares of threads and connections (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.thread_share = max(1, self.cfg.threads // 2)
        self.connection_share = connections_per_host(self.cfg.worker_connections)
        self.open_by_host: Counter[str] = Counter()
        self.busy_by_host: Counter[str] = Counter()
        self.ready_by_host: dict[str, deque[_Conn]] = {}

    def init_signals(self):
        super().init_signals()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master drains on SIGINT and stops this worker

    def accept(self, listener):
        """Accept a connection, unless its host holds its share of this worker's connections."""
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:  # another worker took it, or the client gave up: as gunicorn's accept
            if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            raise
        host = client_host(client_addr[0] if isinstance(client_addr, tuple) else None)
        if self.open_by_host[host] >= self.connection_share:
            client_sock.close()
            return
        self.nr_conns += 1
        self.open_by_host[host] += 1
        client_sock.setblocking(True)
        self.enqueue_req(_Conn(self.cfg, client_sock, client_addr, listener.getsockname(), self._closed))

    def _closed(self, conn: _Conn) -> None:
        self.open_by_host[conn.host] -= 1
        if self.open_by_host[conn.host] <= 0:
            del self.open_by_host[conn.host]

    def enqueue_req(self, conn):
        """Give ``conn`` a thread, or queue it behind its host's requests if they hold the host's share."""
        if not conn.queued:  # accepted, or readable again: its request's read deadline starts now
            conn.ready_at = time.monotonic()
        conn.queued = self.busy_by_host[conn.host] >= self.thread_share
        if conn.queued:
            self.ready_by_host.setdefault(conn.host, deque()).append(conn)
            return
        self.busy_by_host[conn.host] += 1
        super().enqueue_req(conn)

    def handle_request(self, req, conn):
        """Serve a request read in full (and mark it, for :meth:`_Conn.close`)."""
        conn.handled = True
        return super().handle_request(req, conn)

    def finish_request(self, conn, fs):
        """A thread finished with ``conn``: hand it to the host's next ready connection, then carry on."""
        self.busy_by_host[conn.host] -= 1
        if self.busy_by_host[conn.host] <= 0:
            del self.busy_by_host[conn.host]
        ready = self.ready_by_host.get(conn.host)
        if ready:
            waiting = ready.popleft()
            if not ready:
                del self.ready_by_host[conn.host]
            self.enqueue_req(waiting)
        super().finish_request(conn, fs)


class DrainingArbiter(Arbiter):
    """gunicorn's master process, with SIGINT a graceful stop like SIGTERM (gunicorn's own is a quick one)."""

    def handle_int(self):
        raise StopIteration  # what handle_term does: the run loop then stops the workers gracefully


def serve(app, bind: str, workers: int) -> None:
    """Serve ``app`` with ``workers`` gunicorn processes forked from this one (which holds the catalog)."""

    class _Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in {
                "bind": bind,
                "workers": workers,
                # threads keep HTTP connections alive (the sync worker closes every connection)
                "worker_class": FairThreadWorker,
                "threads": THREADS,
                "timeout": 60,
                "graceful_timeout": int(DRAIN_TIMEOUT),
                "preload_app": True,
                "accesslog": None,
                "errorlog": "-",
                # newer gunicorn opens a control socket shared by every server under ~/.gunicorn
                "control_socket_disable": True,
            }.items():
                if key in self.cfg.settings:
                    self.cfg.set(key, value)

        def load(self):
            return app

        def run(self):
            try:
                DrainingArbiter(self).run()
            except RuntimeError as exc:  # as gunicorn's own run(): e.g. the address is in use
                print(f"progpo webshop serve: error: {exc}", file=sys.stderr)
                sys.exit(1)

    quiet_floods("gunicorn.error")  # a traceback per dropped request: one a while (the workers inherit it)
    gc.freeze()  # the catalog's objects are never collected: keep the collector off their (shared) pages
    _Server().run()
