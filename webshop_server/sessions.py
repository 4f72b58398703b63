"""The server's session tables: unguessable ids, idle expiry, a bounded count, one step at a time per session.

Two stores share one interface (:class:`SessionStore`):

* :class:`MemorySessionStore`: sessions live in this process, ordered by last use, so expiring idle ones is a
  pop from the front (amortised O(1) per request). For one server process with several worker threads
  (waitress, the default).
* :class:`SqliteSessionStore`: sessions are JSON rows in one SQLite file (WAL mode), so several server
  processes (gunicorn workers) serve the same sessions and any request may reach any worker. A step reads the
  row, runs the engine outside any lock and writes the row back only if nobody changed it meanwhile
  (optimistic versioning); a concurrent step on the *same* session gets :class:`SessionBusy` (the app answers
  409), while steps on different sessions run in parallel.

A create that would exceed ``max_sessions`` after expiring idle sessions raises :class:`SessionLimitReached`
(the app answers 503). Each session records the client that created it (the app passes the remote address);
otherwise, a client already holding ``max_sessions_per_client`` live sessions gets :class:`ClientShareReached`
(the app answers 429), so one client cannot take the whole table from everyone else. Ids are 128-bit
``secrets.token_urlsafe`` strings: no session can find another's id.

A request that raises inside :meth:`SessionStore.use` changes nothing: the SQLite store never writes the
session back, and the memory store puts back the copy it took before the request (so an action is never
half-applied when rendering its page fails).

Example:
    >>> from webshop_server.engine import Session
    >>> store = MemorySessionStore(max_sessions=2, idle_timeout_s=60)
    >>> sid = store.create(lambda sid: Session(sid, goal_index=0))
    >>> with store.use(sid) as session:
    ...     session.goal_index
    0
    >>> store.close(sid), len(store)
    (True, 0)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from webshop_server.engine import Session


class SessionLimitReached(RuntimeError):
    """The table is full of sessions that are still in use."""


class ClientShareReached(RuntimeError):
    """This client already holds its share of the table (other clients may still create sessions)."""


class UnknownSession(KeyError):
    """No live session has this id (never created, closed, or expired)."""


class SessionBusy(RuntimeError):
    """Another request changed this session while this one was working on it."""


def new_session_id() -> str:
    """A 128-bit random URL-safe id."""
    return secrets.token_urlsafe(16)


class SessionStore(Protocol):
    """What the app needs from a session table."""

    max_sessions: int
    max_sessions_per_client: int
    idle_timeout_s: float

    def create(self, make_session: Callable[[str], Session], client: str = "") -> str:
        """Add ``make_session(new_id)`` for ``client`` and return the id; :class:`ClientShareReached` when
        ``client`` holds ``max_sessions_per_client`` sessions, :class:`SessionLimitReached` when full."""

    def use(self, session_id: str) -> contextlib.AbstractContextManager[Session]:
        """The session, for one request (changes are kept unless the request raises); :class:`UnknownSession`
        if there is none."""

    def close(self, session_id: str) -> bool:
        """Drop a session; whether it existed."""

    def __len__(self) -> int:
        """Live sessions."""


def _limit_message(max_sessions: int, idle_timeout_s: float) -> str:
    return (
        f"session limit reached ({max_sessions} open); close sessions or wait up to {idle_timeout_s:.0f} s "
        "for idle ones to expire"
    )


def _share_message(client: str, store: SessionStore) -> str:
    return (
        f"client {client or '(unknown)'} already holds {store.max_sessions_per_client} open sessions, its "
        f"share of the {store.max_sessions} this server keeps; close some (DELETE /api/sessions/<id>) or "
        f"wait up to {store.idle_timeout_s:.0f} s for idle ones to expire"
    )


def _set_limits(
    store: MemorySessionStore | SqliteSessionStore,
    max_sessions: int,
    idle_timeout_s: float,
    clock: Callable[[], float],
    max_sessions_per_client: int | None,
) -> None:
    """Check a store's limits and set them and its clock on ``store`` (both stores take the same)."""
    if max_sessions < 1 or idle_timeout_s <= 0:
        raise ValueError("max_sessions must be >= 1 and idle_timeout_s > 0")
    store.max_sessions = int(max_sessions)
    if max_sessions_per_client is None:
        store.max_sessions_per_client = store.max_sessions
    elif max_sessions_per_client < 1:
        raise ValueError("max_sessions_per_client must be >= 1 (or None for no separate share)")
    else:
        store.max_sessions_per_client = min(int(max_sessions_per_client), store.max_sessions)
    store.idle_timeout_s = float(idle_timeout_s)
    store._clock = clock


class MemorySessionStore:
    """Thread-safe bounded in-process table with idle expiry.

    Args:
        max_sessions: The most sessions alive at once.
        idle_timeout_s: A session unused this long is dropped.
        clock: Seconds (injectable for tests).
        max_sessions_per_client: The most sessions one client may hold (``None``: no separate share).
    """

    def __init__(
        self,
        max_sessions: int = 10_000,
        idle_timeout_s: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
        max_sessions_per_client: int | None = None,
    ):
        _set_limits(self, max_sessions, idle_timeout_s, clock, max_sessions_per_client)
        # id -> [session, last use, lock, client]; ordered by last use
        self._entries: OrderedDict[str, list] = OrderedDict()
        self._per_client: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._entries)

    def _expire(self, now: float) -> None:
        while self._entries:
            last_used = next(iter(self._entries.values()))[1]
            if now - last_used < self.idle_timeout_s:
                break
            self._forget(self._entries.popitem(last=False)[1])

    def _forget(self, entry: list) -> None:
        client = entry[3]
        self._per_client[client] -= 1
        if not self._per_client[client]:
            del self._per_client[client]

    def create(self, make_session: Callable[[str], Session], client: str = "") -> str:
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._entries) >= self.max_sessions:
                raise SessionLimitReached(_limit_message(self.max_sessions, self.idle_timeout_s))
            if self._per_client.get(client, 0) >= self.max_sessions_per_client:
                raise ClientShareReached(_share_message(client, self))
            session_id = new_session_id()
            self._entries[session_id] = [make_session(session_id), now, threading.Lock(), client]
            self._per_client[client] = self._per_client.get(client, 0) + 1
            return session_id

    @contextlib.contextmanager
    def use(self, session_id: str) -> Iterator[Session]:
        with self._lock:
            now = self._clock()
            self._expire(now)
            entry = self._entries.get(session_id)
            if entry is None:
                raise UnknownSession(session_id)
            entry[1] = now
            self._entries.move_to_end(session_id)
        with entry[2]:
            before = entry[0].to_dict()
            try:
                yield entry[0]
            except BaseException:
                entry[0] = Session.from_dict(before)
                raise

    def close(self, session_id: str) -> bool:
        with self._lock:
            entry = self._entries.pop(session_id, None)
            if entry is None:
                return False
            self._forget(entry)
            return True


class SqliteSessionStore:
    """A bounded table with idle expiry in one SQLite file, shared by every process that opens it.

    Args:
        path: The database file (created if missing).
        max_sessions: The most sessions alive at once (over all processes).
        idle_timeout_s: A session unused this long is dropped.
        clock: Wall-clock seconds (shared by processes; injectable for tests).
        max_sessions_per_client: The most sessions one client may hold (``None``: no separate share).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_sessions: int = 10_000,
        idle_timeout_s: float = 1800.0,
        clock: Callable[[], float] = time.time,
        max_sessions_per_client: int | None = None,
    ):
        _set_limits(self, max_sessions, idle_timeout_s, clock, max_sessions_per_client)
        self.path = Path(path)
        self._local = threading.local()
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, data TEXT NOT NULL, "
                "version INTEGER NOT NULL, last_used REAL NOT NULL, client TEXT NOT NULL DEFAULT '')"
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
            if "client" not in columns:  # a file written before sessions recorded their client
                db.execute("ALTER TABLE sessions ADD COLUMN client TEXT NOT NULL DEFAULT ''")
            db.execute("CREATE INDEX IF NOT EXISTS sessions_last_used ON sessions (last_used)")
            db.execute("CREATE INDEX IF NOT EXISTS sessions_client ON sessions (client)")

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # One connection per thread and per process (a forked worker must not reuse its parent's connection).
        key = (os.getpid(), threading.get_ident())
        if getattr(self._local, "key", None) != key:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.key, self._local.db = key, db
        yield self._local.db

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        db.execute("DELETE FROM sessions WHERE last_used <= ?", (now - self.idle_timeout_s,))

    def __len__(self) -> int:
        with self._db() as db:
            self._expire(db, self._clock())
            return int(db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def create(self, make_session: Callable[[str], Session], client: str = "") -> str:
        session_id = new_session_id()
        data = json.dumps(make_session(session_id).to_dict())
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                now = self._clock()
                self._expire(db, now)
                if db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] >= self.max_sessions:
                    raise SessionLimitReached(_limit_message(self.max_sessions, self.idle_timeout_s))
                held = db.execute("SELECT COUNT(*) FROM sessions WHERE client = ?", (client,)).fetchone()[0]
                if held >= self.max_sessions_per_client:
                    raise ClientShareReached(_share_message(client, self))
                db.execute(
                    "INSERT INTO sessions (id, data, version, last_used, client) VALUES (?, ?, 0, ?, ?)",
                    (session_id, data, now, client),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return session_id

    @contextlib.contextmanager
    def use(self, session_id: str) -> Iterator[Session]:
        with self._db() as db:
            now = self._clock()
            row = db.execute(
                "SELECT data, version FROM sessions WHERE id = ? AND last_used > ?",
                (session_id, now - self.idle_timeout_s),
            ).fetchone()
            if row is None:
                raise UnknownSession(session_id)
            data, version = row
            session = Session.from_dict(json.loads(data))
            yield session
            new_data = json.dumps(session.to_dict())
            if new_data == data:
                db.execute("UPDATE sessions SET last_used = ? WHERE id = ?", (self._clock(), session_id))
                return
            updated = db.execute(
                "UPDATE sessions SET data = ?, version = version + 1, last_used = ? "
                "WHERE id = ? AND version = ?",
                (new_data, self._clock(), session_id, version),
            ).rowcount
            if updated != 1:
                raise SessionBusy("the session changed during this request (one step at a time per session)")

    def close(self, session_id: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 1
