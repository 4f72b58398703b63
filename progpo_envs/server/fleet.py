"""Many env servers, one env: ``progpo/Remote-v0`` spread over several ``progpo serve`` servers.

``url`` names one server or several: a sequence of URLs, or one string of URLs separated by commas (the form
a config value or a command line carries)::

    envs = gymnasium.make_vec("progpo/Remote-v0", num_envs=32, group_size=8, env_id="progpo/ALFWorld-v0",
                              url="http://host1:8000,http://host2:8000,http://host3:8000")

With one URL the env is :class:`~progpo_envs.server.remote.RemoteEnv` (its vector env
:class:`~progpo_envs.server.remote.RemoteGroupVectorEnv`), exactly as before. With several it is this
module's :class:`FleetRemoteEnv` (:class:`FleetGroupVectorEnv`): the same observations, rewards, flags and
infos, plus:

* **Placement by load.** A task group lives on one server, all its ``G`` copies (their batch requests stay
  whole). Each group goes to the server with the fewest sessions this process holds there (then the fewest
  groups, then the first in the list): deterministic, so ``B`` groups of one vector env take turns over the
  servers. Every remote env of the process that names the same list shares one :class:`ServerFleet`, so the
  training and the evaluation envs, or TRL's one env per rollout, count against each other.
* **One request per server at a time, in parallel.** A vector step is one batch request per server, sent
  together from a thread per server, so three servers step three batches at once.
* **A lost server costs episodes, not the run.** A server that stops answering (connection refused or
  reset, no answer within ``timeout``), answers 502/503/504 (draining, its env workers starting), or has
  lost a group's instances (410/404: a worker died, the server restarted) fails the episodes in flight
  there: each copy's step returns its last observation with reward 0, ``truncated=True`` and
  ``info["env_error"]`` saying what happened, and later steps of that copy return the same without a
  request, as an ended episode does. At the group's next reset its copies are made again on the least
  loaded server that works and the reset goes there; a server that refused a new session (429) or failed
  takes no new groups until a health probe (``GET /ready``) passes, at most every ``retry_s`` seconds (or
  at once when no server is left). A reset moves a group to a less loaded server only when that evens the
  load (a server that came back gets its share again). Only when no server works does a reset raise
  (:class:`NoServerError`).
* **A hung server costs seconds.** A server whose batch runs past ``hang_after`` seconds is probed on a
  connection of its own; one that does not answer within ``probe_timeout`` (stopped, its event loop stuck)
  is down at once, its copies' episodes fail as above and the step returns without it
  (:meth:`ServerFleet.gather`); its late answer is never read, and its copies get no other call. Instances
  left on a server that did not answer are closed once it answers again.
* **Each server once.** The fleet probes every server as it is made, and refuses one server under two
  names (``progpo serve`` names itself in ``/ready``: its ``server_id``).
* **Every server visible.** Each copy's ``info["server"]`` is the URL it plays on; the vector env's
  :meth:`FleetGroupVectorEnv.servers` (and the single env's :meth:`FleetRemoteEnv.servers`) is each
  server's state (``up``, ``down``, ``not_ready``, ``full``), the groups and sessions it holds now, the
  episodes its failures ended, the groups that had to leave it, its errors and the last one. The trainer
  and ``progpo eval`` record it (``training.metrics.server_metrics``, ``summary.json``'s ``servers``).

``vector_mode="async"`` takes one URL only: the batched backend is already one request per server in
parallel, and subprocess copies could not keep a group on one server.

Example:
    >>> server_urls("http://a:8000, http://b:8000/")
    ('http://a:8000', 'http://b:8000')
    >>> server_urls(["http://a:8000"])
    ('http://a:8000',)
    >>> envs = gym.make_vec("progpo/Remote-v0", num_envs=8, group_size=4, env_id="progpo/ALFWorld-v0",
    ...                     url="http://a:8000,http://b:8000")  # doctest: +SKIP
    >>> [s["groups"] for s in envs.servers()]  # doctest: +SKIP
    [1, 1]
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import gymnasium as gym
import requests

from progpo_envs.core.http_client import DeadlineSession
from progpo_envs.core.vector import VectorMode
from progpo_envs.core.worker_protocol import Call, ResetResult, StepResult, apply_command
from progpo_envs.server.remote import (
    RemoteEnv,
    RemoteEnvError,
    RemoteGroupVectorEnv,
    ServerUnavailableError,
    check_server_url,
    reset_batch,
    step_batch,
)


def server_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """The server URLs ``url`` names, in order: one URL, several separated by commas, or a sequence of URLs.

    Raises:
        ValueError: No URL, a URL that cannot name a server (the scheme, the host, the port:
            :func:`~progpo_envs.server.remote.check_server_url`), or one URL named twice (two names of one
            server would count its load twice; :class:`ServerFleet` also finds one server under two names).
    """
    parts = url.split(",") if isinstance(url, str) else [str(u) for u in url]
    urls = tuple(check_server_url(part) for part in parts if part.strip())
    if not urls:
        raise ValueError(f"url names no env server: {url!r}")
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    if repeated:
        raise ValueError(f"url names a server more than once: {', '.join(repeated)}")
    return urls


class NoServerError(ServerUnavailableError):
    """No server of the fleet can take a group (each one is down, draining or full)."""


class ServerState(str, enum.Enum):
    """What the client knows of one server."""

    UP = "up"  # answers; takes new groups
    DOWN = "down"  # did not answer (connection refused or reset, no answer in time, 502/504)
    NOT_READY = "not_ready"  # answers 503: draining, or its env workers are (re)starting
    FULL = "full"  # refused a new session (429: its instance limit)


#: Failures that say the server (not the request) is at fault, by HTTP status; ``None``: no answer.
_SERVER_STATES = {
    None: ServerState.DOWN,
    502: ServerState.DOWN,
    504: ServerState.DOWN,
    503: ServerState.NOT_READY,
}
#: Per-instance failures that mean the instance is gone while its server still answers.
_LOST_STATUSES = {404, 410}
#: States whose server is gone for now: its instances are not closed now (a close would wait out the
#: retries) but once it answers again (:meth:`ServerFleet.orphan`), and its groups leave at their next reset.
_GONE = (ServerState.DOWN, ServerState.NOT_READY)
#: Instances of one server kept to close once it answers again; past it the oldest are forgotten (a server
#: that comes back expires them by its idle timeout).
MAX_ORPHANS = 4096


@dataclasses.dataclass(eq=False)
class FleetServer:
    """One server of a :class:`ServerFleet` and its share (this process's view; see :meth:`status`)."""

    index: int
    url: str
    state: ServerState = ServerState.UP
    groups: int = 0
    sessions: int = 0
    failed_episodes: int = 0
    lost_groups: int = 0
    moved_groups: int = 0
    errors: int = 0
    last_error: str = ""
    #: ``time.monotonic()`` of the last state change or probe.
    checked: float = dataclasses.field(default_factory=time.monotonic)
    #: ``time.monotonic()`` of its last answer (to a request or a probe).
    heard: float = dataclasses.field(default_factory=time.monotonic)
    #: The ``server_id`` its last health probe answered (``None``: not known, or a server that names none).
    server_id: str | None = None
    #: Instances left there while it did not answer, closed once it answers again.
    orphans: list[RemoteEnv] = dataclasses.field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """``{url, state, groups, sessions, failed_episodes, lost_groups, moved_groups, errors, last_error}``:
        groups and sessions held there now; episodes in flight that its failures ended; groups whose
        instances it lost (made again at their next reset, elsewhere if it was down); groups moved off it to
        even the load; failures seen and the last one."""
        return {
            "url": self.url,
            "state": self.state.value,
            "groups": self.groups,
            "sessions": self.sessions,
            "failed_episodes": self.failed_episodes,
            "lost_groups": self.lost_groups,
            "moved_groups": self.moved_groups,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class ServerFleet:
    """The servers of one URL list and what this process holds on each (one per list: :func:`fleet_for`).

    Made with a health probe of every server, together: one that answers with the ``server_id`` of another
    (one server under two names) is refused. A request to a server that runs past ``hang_after`` seconds has
    its server probed on a connection of its own (:meth:`gather`); a server that does not answer the probe
    within ``probe_timeout`` is down, so a hung server (stopped, its event loop stuck, its host gone without
    a reset) costs its copies ``hang_after + probe_timeout`` seconds, not the requests' ``timeout``.

    Args:
        urls: The servers, in order (the order breaks ties).
        ready_path: The health probe (``/ready`` for ``progpo serve``; ``/health`` for its OpenEnv door).
        retry_s: Seconds before a failed server is probed again (at once when no server is up).
        probe_timeout: Seconds a probe may take.
        hang_after: Seconds a request may run (or a server go unheard before a new group goes there) before
            its server is probed.

    Raises:
        ValueError: A URL that names no server, or two URLs of one server.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        ready_path: str = "/ready",
        retry_s: float = 5.0,
        probe_timeout: float = 3.0,
        hang_after: float = 3.0,
    ):
        self.servers = [FleetServer(i, url) for i, url in enumerate(server_urls(urls))]
        self.ready_path = ready_path
        self.retry_s = float(retry_s)
        self.probe_timeout = float(probe_timeout)
        self.hang_after = float(hang_after)
        self.lock = threading.RLock()
        # the probes, off the callers' threads (each may wait probe_timeout), and the closing of orphans on a
        # thread of its own (a close that waits holds up no probe)
        self._helpers = ThreadPoolExecutor(
            max_workers=2 * len(self.servers), thread_name_prefix="progpo-probe"
        )
        self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="progpo-orphans")
        for _ in self._helpers.map(self.probe, self.servers):
            pass
        named: dict[str, list[str]] = {}
        for server in self.servers:
            if server.server_id is not None:
                named.setdefault(server.server_id, []).append(server.url)
        twice = {server_id: urls for server_id, urls in named.items() if len(urls) > 1}
        if twice:
            self._helpers.shutdown(wait=False)
            self._closer.shutdown(wait=False)
            raise ValueError(
                "url names one env server more than once: "
                + "; ".join(f"{' and '.join(urls)} are server {sid}" for sid, urls in twice.items())
                + " (its load would be counted apart for each name): name each server once"
            )

    def __len__(self) -> int:
        return len(self.servers)

    def status(self) -> list[dict[str, Any]]:
        """Each server's :meth:`FleetServer.status`, in the list's order."""
        with self.lock:
            return [server.status() for server in self.servers]

    def hold(self, server: FleetServer, sessions: int, groups: int = 1) -> None:
        """Count ``groups`` groups of ``sessions`` sessions on ``server`` (negative: released)."""
        with self.lock:
            server.sessions += sessions
            server.groups += groups

    def fail(self, server: FleetServer, state: ServerState | None, error: str) -> None:
        """A failure seen on ``server``: counted, remembered, and its new state (``None``: unchanged)."""
        with self.lock:
            server.errors += 1
            server.last_error = error
            if state is not None and server.state is not state:
                server.state, server.checked = state, time.monotonic()

    def count(self, server: FleetServer, **increments: int) -> None:
        """Add to ``server``'s counters (``failed_episodes=1``, ``lost_groups=1``, ...)."""
        with self.lock:
            for name, value in increments.items():
                setattr(server, name, getattr(server, name) + value)

    def heard(self, server: FleetServer) -> None:
        """``server`` answered just now."""
        server.heard = time.monotonic()

    def orphan(self, server: FleetServer, env: RemoteEnv) -> None:
        """``env``'s instance stays on ``server``, which does not answer now: it is closed once it does (a
        stopped server that is continued keeps its instances; one that restarted answers 404, quietly)."""
        with self.lock:
            server.orphans.append(env)
            del server.orphans[:-MAX_ORPHANS]

    def _answered(self, server: FleetServer) -> None:
        """A probe of ``server`` got an answer: heard, and its orphans closed (off this thread)."""
        self.heard(server)
        with self.lock:
            orphans, server.orphans = server.orphans, []
        if orphans:
            self._closer.submit(_close_all, orphans)

    def probe(self, server: FleetServer) -> ServerState:
        """``GET <url><ready_path>``: 200 is up, 503 not ready, anything else (or no answer) down; a server
        whose ``server_id`` another server of the list answered too is down (one server, two names)."""
        session = DeadlineSession(self.probe_timeout, connect_timeout=self.probe_timeout)
        server_id = None
        try:
            answer = session.get(server.url + self.ready_path)
            state = {200: ServerState.UP, 503: ServerState.NOT_READY}.get(
                answer.status_code, ServerState.DOWN
            )
            error = "" if state is ServerState.UP else f"health probe answered HTTP {answer.status_code}"
            server_id = _server_id(answer)
            self._answered(server)
        except requests.RequestException as exc:
            state, error = ServerState.DOWN, f"health probe failed: {type(exc).__name__}: {exc}"
        finally:
            session.close()
        with self.lock:
            server.server_id = server_id
            twin = next(
                (s for s in self.servers if s is not server and server_id and s.server_id == server_id), None
            )
            if twin is not None:
                state = ServerState.DOWN
                error = f"the same server as {twin.url} (server id {server_id}): name each server once"
            server.state, server.checked = state, time.monotonic()
            if error:
                server.last_error = error
        return state

    def responsive(self, server: FleetServer) -> bool:
        """Whether ``server`` answers ``GET <url><ready_path>`` at all (any status: a draining server still
        finishes what it has) within ``probe_timeout``, on a connection of its own."""
        session = DeadlineSession(self.probe_timeout, connect_timeout=self.probe_timeout)
        try:
            session.get(server.url + self.ready_path)
        except requests.RequestException:
            return False
        finally:
            session.close()
        self._answered(server)
        return True

    def answering(self, server: FleetServer) -> bool:
        """Whether ``server`` may be sent work: heard within ``hang_after`` seconds, or answering a probe now
        (if not, it is down): a server that hung while nothing was asked of it is found before a group is
        made or closed there, not by a request that waits out its ``timeout``."""
        if time.monotonic() - server.heard < self.hang_after or self.responsive(server):
            return True
        self.fail(server, ServerState.DOWN, self._hung(server, "it had not been heard from"))
        return False

    def _hung(self, server: FleetServer, why: str) -> str:
        return (
            f"env server {server.url} stopped answering: {why}, and GET {self.ready_path} got no answer "
            f"within {self.probe_timeout:g} s"
        )

    def gather(self, futures: dict[FleetServer, Future]) -> dict[FleetServer, Any]:
        """Each server's request's outcome (its future's result), waiting for them all, except that a server
        whose request has run ``hang_after`` seconds is probed (again every ``hang_after`` seconds while it
        answers), and one whose probe gets no answer within ``probe_timeout`` is down: its outcome is a
        :class:`~progpo_envs.server.remote.ServerUnavailableError` at once, and its request's late answer is
        never read (its instances are the caller's to give up)."""
        started = time.monotonic()
        outcomes: dict[FleetServer, Any] = {}
        probe_at = dict.fromkeys(futures, started + self.hang_after)
        probes: dict[FleetServer, Future] = {}
        while len(outcomes) < len(futures):
            waiting = [s for s in futures if s not in outcomes]
            due = [probe_at[s] for s in waiting if s not in probes]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            wait(
                [futures[s] for s in waiting] + list(probes.values()),
                timeout=timeout,
                return_when=FIRST_COMPLETED,
            )
            now = time.monotonic()
            for server in waiting:
                if futures[server].done():
                    outcomes[server] = futures[server].result()
                    probes.pop(server, None)
                    if not isinstance(outcomes[server], ServerUnavailableError):
                        self.heard(server)
                elif server in probes and probes[server].done():
                    if probes.pop(server).result():  # alive, only slow: wait on
                        probe_at[server] = now + self.hang_after
                    else:
                        why = f"a request had run {now - started:.1f} s"
                        outcomes[server] = ServerUnavailableError(None, self._hung(server, why))
                elif server not in probes and now >= probe_at[server]:
                    probes[server] = self._helpers.submit(self.responsive, server)
        return outcomes

    def _recover(self) -> None:
        """Probe the servers that are not up and due (all of them when none is up)."""
        with self.lock:
            now = time.monotonic()
            none_up = not any(s.state is ServerState.UP for s in self.servers)
            due = [
                s
                for s in self.servers
                if s.state is not ServerState.UP and (none_up or now - s.checked >= self.retry_s)
            ]
        for _ in self._helpers.map(self.probe, due):
            pass

    def choose(self, current: FleetServer | None = None) -> FleetServer:
        """The server a group goes to now: ``current`` while it is up and no up server holds fewer sessions
        (the group's own released first); else the up server with the fewest sessions, then groups, then
        the first listed; one not heard from lately is probed first (:meth:`answering`).

        Raises:
            NoServerError: No server is up, even after a probe of each.
        """
        self._recover()
        while True:
            with self.lock:
                up = [s for s in self.servers if s.state is ServerState.UP]
                if not up:
                    raise NoServerError(
                        None,
                        "no env server is available: "
                        + "; ".join(
                            f"{s.url} {s.state.value} ({s.last_error or 'no error'})" for s in self.servers
                        ),
                    )
                best = min(up, key=lambda s: (s.sessions, s.groups, s.index))
                if (
                    current is not None
                    and current.state is ServerState.UP
                    and current.sessions <= best.sessions
                ):
                    best = current
            if self.answering(best):
                return best


def _close_all(envs: list[RemoteEnv]) -> None:
    """Close each env's instance (quietly: :meth:`~progpo_envs.server.remote.RemoteEnv.close`)."""
    for env in envs:
        env.close()


def _server_id(answer: requests.Response) -> str | None:
    """The ``server_id`` a health probe's JSON answer names (``progpo serve``'s ``/ready`` and ``/health``),
    or ``None``."""
    try:
        server_id = answer.json().get("server_id")
    except (ValueError, AttributeError):
        return None
    return server_id if isinstance(server_id, str) and server_id else None


_FLEETS: dict[tuple[tuple[str, ...], str], ServerFleet] = {}
_FLEETS_LOCK = threading.Lock()


def fleet_for(urls: str | Sequence[str], ready_path: str = "/ready") -> ServerFleet:
    """The process's :class:`ServerFleet` of ``urls`` (made on first use; the same list, the same fleet)."""
    key = (server_urls(urls), ready_path)
    with _FLEETS_LOCK:
        if key not in _FLEETS:
            _FLEETS[key] = ServerFleet(key[0], ready_path=ready_path)
        return _FLEETS[key]


def server_failure(exc: RemoteEnvError) -> ServerState | None:
    """The state a whole request's failure puts its server in, or ``None`` when the request itself was at
    fault (a 4xx the caller must see)."""
    if isinstance(exc, ServerUnavailableError):
        return ServerState.DOWN
    return _SERVER_STATES.get(exc.status)


def _create_failure(exc: RemoteEnvError) -> ServerState | None:
    """The state a refused create puts its server in (429: full), or ``None`` (the request was wrong)."""
    return ServerState.FULL if exc.status == 429 else server_failure(exc)


class FleetBackend:
    """The group vector env's backend over a :class:`ServerFleet` (a
    :class:`~progpo_envs.core.worker_protocol.VectorBackend`; see the module docstring).

    Args:
        fleet: The servers.
        env_kwargs: :class:`~progpo_envs.server.remote.RemoteEnv`'s arguments but ``url`` (``env_id``, the
            timeouts, the hosted env's kwargs).
        num_envs: Copies.
        group_size: Copies per group (a group lives on one server).
    """

    def __init__(self, fleet: ServerFleet, env_kwargs: dict[str, Any], num_envs: int, group_size: int):
        if num_envs % group_size:
            raise ValueError(f"num_envs ({num_envs}) must be a multiple of group_size ({group_size})")
        self.fleet, self.env_kwargs = fleet, dict(env_kwargs)
        self.num_envs, self.group_size = int(num_envs), int(group_size)
        self.copies: list[RemoteEnv | None] = [None] * self.num_envs
        self.homes: list[FleetServer | None] = [None] * (self.num_envs // self.group_size)
        #: Per copy: why its instance cannot be used (``None``: it can), and its last result (the latch).
        self.lost: list[str | None] = [None] * self.num_envs
        self.last: list[StepResult | None] = [None] * self.num_envs
        # a request to a server found hung is left running until its own deadline: room for one per server
        self._pool = ThreadPoolExecutor(max_workers=2 * len(fleet), thread_name_prefix="progpo-fleet")
        self._creating = ThreadPoolExecutor(max_workers=self.group_size, thread_name_prefix="progpo-create")
        try:
            for group in range(len(self.homes)):
                self._house(group, self.fleet.choose())
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ groups and their servers
    def _group_copies(self, group: int) -> range:
        return range(group * self.group_size, (group + 1) * self.group_size)

    def _house(self, group: int, server: FleetServer) -> None:
        """Make the group's copies on ``server``, or on the next server that works when it cannot."""
        while True:
            # the copies are made together: each create is a round trip to an env worker (a game loaded),
            # and one after another they made a regrouping after a lost server take seconds per group
            creates = [
                self._creating.submit(RemoteEnv, server.url, **self.env_kwargs)
                for _ in self._group_copies(group)
            ]
            made: list[RemoteEnv] = []
            failure: BaseException | None = None
            for create in creates:
                try:
                    made.append(create.result())
                except BaseException as exc:  # noqa: BLE001 - the first failure is raised once all are in
                    failure = failure or exc
            if isinstance(failure, RemoteEnvError):
                state = _create_failure(failure)
                for env in made:
                    self.fleet.orphan(server, env) if state in _GONE else env.close()
                if state is None:
                    raise failure
                self.fleet.fail(server, state, str(failure))
                server = self.fleet.choose()
                continue
            if failure is not None:
                for env in made:
                    env.close()
                raise failure
            self.fleet.heard(server)
            for i, env in zip(self._group_copies(group), made, strict=True):
                self.copies[i], self.lost[i], self.last[i] = env, None, None
            self.homes[group] = server
            self.fleet.hold(server, self.group_size)
            return

    def _release(self, group: int) -> None:
        """Close the group's instances (where their server does not answer: once it does, off this thread)."""
        home = self.homes[group]
        if home is None:
            return
        answering = home.state not in _GONE and self.fleet.answering(home)
        for i in self._group_copies(group):
            env = self.copies[i]
            if env is not None:
                env.close() if answering else self.fleet.orphan(home, env)
            self.copies[i] = None
        self.fleet.hold(home, -self.group_size, -1)
        self.homes[group] = None

    def _rehome(self, group: int) -> None:
        """Before the group's reset: made again where its instances are lost, moved to an up server that
        evens the load, or kept."""
        home = self.homes[group]
        lost = any(self.lost[i] is not None for i in self._group_copies(group))
        working = home is not None and home.state is ServerState.UP
        if working and not lost:
            self.fleet.hold(home, -self.group_size, -1)  # its own share does not count against it
            target = self.fleet.choose(home)
            self.fleet.hold(home, self.group_size)
            if target is home:
                return
            self.fleet.count(home, moved_groups=1)
        else:
            if home is not None:
                self.fleet.count(home, lost_groups=1)
            target = None
        self._release(group)
        self._house(group, target or self.fleet.choose())

    # ------------------------------------------------------------------ failures
    def _fail(self, i: int, server: FleetServer, error: str) -> StepResult:
        """Copy ``i``'s instance is lost: the episode in flight ends here (one failed episode), and the copy
        returns that ending until its next reset."""
        if self.lost[i] is None:
            self.lost[i] = error
            last = self.last[i]
            if last is not None and not (last[2] or last[3]):  # an episode in flight: it fails
                self.fleet.count(server, failed_episodes=1)
                info = {**last[4], "env_error": error, "server": server.url}
                self.last[i] = (last[0], 0.0, False, True, info)
            elif last is not None:  # it had ended: it stays ended
                self.last[i] = (last[0], 0.0, last[2], last[3], last[4])
        return self._latched(i)

    def _latched(self, i: int) -> StepResult:
        """Copy ``i``'s ending again (a fresh info each time, as an env returns: a lost copy is rare)."""
        last = self.last[i]
        if last is None:  # never reset: nothing to end
            raise gym.error.ResetNeeded(f"copy {i} lost its instance before its first reset: {self.lost[i]}")
        return (last[0], last[1], last[2], last[3], copy.deepcopy(last[4]))

    def _run(
        self,
        by_server: dict[FleetServer, list[int]],
        call: Callable[[list[int]], list[Any]],
        failed: Callable[[FleetServer, list[int], RemoteEnvError], list[Any]],
    ) -> Iterator[tuple[FleetServer, int, Any]]:
        """``call(copies)`` for each server's copies, the servers in parallel: ``(server, copy, result)`` for
        each copy, server by server. A server's error (a hung server's as soon as its probe finds it so,
        :meth:`ServerFleet.gather`) gives ``failed(server, copies, error)``'s results instead, ``None`` for a
        copy lost: its instance is given up at its group's next reset, so whatever the server's late answer
        did (it is never read) is never built on: no call of theirs is sent again."""

        def one(copies: list[int]) -> list[Any] | RemoteEnvError:
            try:
                return call(copies)
            except RemoteEnvError as exc:
                return exc

        futures = {server: self._pool.submit(one, copies) for server, copies in by_server.items()}
        for server, outcome in self.fleet.gather(futures).items():
            some = by_server[server]
            if isinstance(outcome, RemoteEnvError):
                outcome = failed(server, some, outcome)
            yield from ((server, i, result) for i, result in zip(some, outcome, strict=True))

    # ------------------------------------------------------------------ the backend
    def step(self, actions: Sequence[Any], copies: Sequence[int] | None = None) -> list[StepResult]:
        """Step the copies: one batch request per server, the servers in parallel; a copy whose server or
        instance is lost returns its failed (or ended) episode's last step."""
        copies = list(range(self.num_envs)) if copies is None else list(copies)
        if len(actions) != len(copies):
            raise ValueError(f"expected {len(copies)} actions, got {len(actions)}")
        action_of = dict(zip(copies, actions, strict=True))
        results: dict[int, StepResult] = {}
        by_server: dict[FleetServer, list[int]] = {}
        for i in copies:
            server = self.homes[i // self.group_size]
            if self.lost[i] is not None:
                results[i] = self._latched(i)
            elif server.state in _GONE:
                error = f"env server {server.url} is {server.state.value}: {server.last_error}"
                results[i] = self._fail(i, server, error)
            else:
                by_server.setdefault(server, []).append(i)

        def call(some: list[int]) -> list[StepResult]:
            return step_batch([self.copies[i] for i in some], [action_of[i] for i in some])

        for server, i, result in self._run(by_server, call, self._failed_batch):
            if result is not None:
                result[4]["server"] = server.url
                results[i] = self.last[i] = result
        for i in copies:  # a copy its server's failure lost: its ending
            if i not in results:
                results[i] = self._latched(i)
        return [results[i] for i in copies]

    def _failed_batch(self, server: FleetServer, some: list[int], exc: RemoteEnvError) -> list[Any]:
        """The results of a step batch that failed on ``server``: ``None`` where a copy's instance (or the
        server) is lost, that copy's episode failed and latched; re-raises what the caller must see."""
        for position in self._lost_items(server, some, exc):
            self._fail(some[position], server, f"env server {server.url}: {exc}")
        return list(getattr(exc, "results", None) or [None] * len(some))

    def _lost_items(self, server: FleetServer, some: list[int], exc: RemoteEnvError) -> list[int]:
        """The positions (in ``some``) of the copies a failed batch on ``server`` lost, the server's state
        updated; re-raises a failure of the request itself (a 4xx other than a lost instance)."""
        statuses: dict[int, int | None] | None = getattr(exc, "statuses", None)
        if statuses is None:  # the whole request failed
            state = server_failure(exc)
            if state is None:
                raise exc
            self.fleet.fail(server, state, str(exc))
            return list(range(len(some)))
        if any(s not in _LOST_STATUSES and s not in _SERVER_STATES for s in statuses.values()):
            if all(s == 409 for s in statuses.values()) and "reset" in str(exc):
                raise gym.error.ResetNeeded(str(exc)) from exc
            raise exc
        states = [_SERVER_STATES[s] for s in statuses.values() if s in _SERVER_STATES]
        self.fleet.fail(
            server, ServerState.DOWN if ServerState.DOWN in states else next(iter(states), None), str(exc)
        )
        return sorted(statuses)

    def reset(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        copies: Sequence[int] | None = None,
    ) -> list[ResetResult]:
        """Reset the copies; a group reset whole first moves to a server that works (module docstring)."""
        copies = list(range(self.num_envs)) if copies is None else list(copies)
        if not len(seeds) == len(options) == len(copies):
            raise ValueError("reset needs one seed and one options entry per copy")
        arguments = {i: (seed, opts) for i, seed, opts in zip(copies, seeds, options, strict=True)}
        groups = sorted({i // self.group_size for i in copies})
        whole = [g for g in groups if all(i in arguments for i in self._group_copies(g))]
        for group in groups:
            if group in whole:
                self._rehome(group)
            elif any(self.lost[i] is not None for i in self._group_copies(group)):
                raise ServerUnavailableError(
                    None,
                    f"group {group} lost its instances; reset all its copies together to make them again",
                )
        results: dict[int, ResetResult] = {}
        pending = list(copies)
        for _ in range(2 * len(self.fleet) + 1):  # each retry follows a server's (or an instance's) loss
            by_server: dict[FleetServer, list[int]] = {}
            for i in pending:
                by_server.setdefault(self.homes[i // self.group_size], []).append(i)

            def call(some: list[int]) -> list[ResetResult]:
                return reset_batch(
                    [self.copies[i] for i in some],
                    [arguments[i][0] for i in some],
                    [arguments[i][1] for i in some],
                )

            again: set[int] = set()
            for server, i, result in self._run(by_server, call, self._failed_reset):
                if result is None:
                    again.add(i // self.group_size)
                    continue
                result[1]["server"] = server.url
                results[i] = result
                self.last[i], self.lost[i] = (result[0], 0.0, False, False, result[1]), None
            if not again:
                return [results[i] for i in copies]
            for group in sorted(again):  # made again where a server works, and reset there
                if group not in whole:
                    raise ServerUnavailableError(None, f"group {group} lost its instances during a reset")
                self._rehome(group)
            pending = [i for i in copies if i // self.group_size in again]
        raise NoServerError(None, f"reset failed on every server: {self.fleet.status()}")

    def _failed_reset(self, server: FleetServer, some: list[int], exc: RemoteEnvError) -> list[Any]:
        """The results of a reset batch that failed on ``server``: ``None`` for a copy to reset again (its
        instance marked lost); re-raises what the caller must see."""
        for position in self._lost_items(server, some, exc):
            self.lost[some[position]] = str(exc)
        return list(getattr(exc, "results", None) or [None] * len(some))

    def call(self, name: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """:class:`~progpo_envs.core.worker_protocol.Call` ``name`` on every copy's remote env."""
        return [apply_command(env, Call(name, args, kwargs or {})) for env in self.copies]

    def status(self) -> list[dict[str, Any]]:
        """Each server's state and share (:meth:`ServerFleet.status`)."""
        return self.fleet.status()

    def close(self) -> None:
        """Close every instance (those on a server that is down are forgotten) and the request threads."""
        for group in range(len(self.homes)):
            self._release(group)
        self._pool.shutdown(wait=False)
        self._creating.shutdown(wait=False)


class FleetGroupVectorEnv(RemoteGroupVectorEnv):
    """The group vector env of ``progpo/Remote-v0`` over several servers (``url`` a list: module docstring).

    Args:
        num_envs: Total copies (``B·G``).
        group_size: Copies per task group (all on one server).
        vector_mode: ``"sync"`` only.
        **kwargs: ``url`` (the servers), ``env_id`` and the rest of
            :class:`~progpo_envs.server.remote.RemoteEnv`'s arguments.
    """

    def make_backend(
        self, entry_point: str, env_kwargs: dict[str, Any], num_workers: int | None, mp_context: str | None
    ) -> FleetBackend:
        """A :class:`FleetBackend` over the servers of ``env_kwargs["url"]``."""
        if self.vector_mode is not VectorMode.SYNC:
            raise ValueError(
                "several env servers take vector_mode='sync' (a vector step is already one request per "
                "server, the servers in parallel)"
            )
        kwargs = dict(env_kwargs)
        fleet = fleet_for(kwargs.pop("url"))
        return FleetBackend(fleet, kwargs, self.num_envs, self.group_size)

    def servers(self) -> list[dict[str, Any]]:
        """Each server's state and share (:meth:`FleetServer.status`)."""
        return self.backend.status()


class FleetRemoteEnv(gym.Env[str, str]):
    """One remote env over several servers (``gymnasium.make("progpo/Remote-v0", url=[...])``): a group of
    one copy of a :class:`FleetBackend`, so it is placed by load, and a lost server ends its episode (step:
    ``truncated`` with ``info["env_error"]``) and its next reset plays on a server that works.

    Args:
        url: The servers.
        env_id: The hosted env.
        render_mode: ``"ansi"`` or ``None``.
        **kwargs: The rest of :class:`~progpo_envs.server.remote.RemoteEnv`'s arguments.
    """

    metadata = RemoteEnv.metadata

    def __init__(
        self, url: str | Sequence[str], env_id: str, *, render_mode: str | None = None, **kwargs: Any
    ):
        self.render_mode = render_mode
        self.backend = FleetBackend(
            fleet_for(url), {"env_id": env_id, "render_mode": render_mode, **kwargs}, 1, 1
        )
        first = self.backend.copies[0]
        self.env_id = env_id
        self.metadata = first.metadata
        self.observation_space, self.action_space = first.observation_space, first.action_space
        self._observation: str | None = None

    @property
    def remote(self) -> RemoteEnv | None:
        """The instance it plays now (``None`` once closed)."""
        return self.backend.copies[0]

    @property
    def url(self) -> str | None:
        """The server it plays on now."""
        home = self.backend.homes[0]
        return None if home is None else home.url

    @property
    def num_tasks(self) -> int | None:
        """Tasks in the hosted split."""
        return self.remote.num_tasks

    @property
    def max_steps(self) -> int | None:
        """The hosted env's step limit."""
        return self.remote.max_steps

    @property
    def elapsed_steps(self) -> int:
        """Actions taken in the current episode."""
        return self.remote.elapsed_steps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Reset (on a server that works: see the module docstring)."""
        super().reset(seed=seed)
        observation, info = self.backend.reset([seed], [options])[0]
        self._observation = observation
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Step; a lost server or instance ends the episode (``truncated``, ``info["env_error"]``)."""
        result = self.backend.step([action])[0]
        self._observation = result[0]
        return result

    def available_actions(self) -> Any:
        """The env's current admissible/available actions."""
        return self.remote.available_actions()

    def render(self) -> str | None:
        """The last observation (``render_mode="ansi"``)."""
        return self._observation if self.render_mode == "ansi" else None

    def servers(self) -> list[dict[str, Any]]:
        """Each server's state and share (:meth:`FleetServer.status`)."""
        return self.backend.status()

    def close(self) -> None:
        """Close the instance."""
        if getattr(self, "backend", None) is not None:
            self.backend.close()


def make_remote_env(url: str | Sequence[str], env_id: str, **kwargs: Any) -> gym.Env:
    """``progpo/Remote-v0``'s entry point: a :class:`~progpo_envs.server.remote.RemoteEnv` for one server,
    a :class:`FleetRemoteEnv` for several (``url``: see :func:`server_urls`)."""
    urls = server_urls(url)
    if len(urls) == 1:
        return RemoteEnv(urls[0], env_id, **kwargs)
    return FleetRemoteEnv(urls, env_id, **kwargs)


def make_remote_vector_env(
    num_envs: int = 1, group_size: int = 1, vector_mode: VectorMode | str = VectorMode.SYNC, **kwargs: Any
) -> RemoteGroupVectorEnv:
    """``progpo/Remote-v0``'s vector entry point: a
    :class:`~progpo_envs.server.remote.RemoteGroupVectorEnv` for one server, a :class:`FleetGroupVectorEnv`
    for several."""
    if "url" not in kwargs:
        raise TypeError("progpo/Remote-v0 needs url= (one env server or several)")
    urls = server_urls(kwargs.pop("url"))
    if len(urls) == 1:
        return RemoteGroupVectorEnv(num_envs, group_size, vector_mode, url=urls[0], **kwargs)
    return FleetGroupVectorEnv(num_envs, group_size, vector_mode, url=urls, **kwargs)
