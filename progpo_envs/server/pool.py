"""Env instances live in worker subprocesses; the pool routes requests to them and survives their death.

The HTTP front (:mod:`progpo_envs.server.app`) is threaded; the envs are CPU-bound Python, so they run in
``num_workers`` subprocesses (:mod:`progpo_envs.server.pool_worker`: one message at a time each, each
answered with a :class:`~progpo_envs.core.worker_protocol.Reply`), which also isolates faults: if an env
crashes or a worker is killed, only the instances on that worker are lost (their next request is a 410 with a
message), the worker is restarted, and every other instance keeps serving.

Each instance has an unguessable id (``secrets.token_urlsafe``), is placed on the least-loaded live worker,
and expires after ``idle_timeout`` seconds without a request. Mutating calls (reset, step) may carry a ``seq``
number: the worker remembers the last ``seq``, the call and its reply, so a client that lost a reply can
resend the same call and get the same answer instead of stepping twice (that makes step and reset safe to
retry); a *different* call with a used ``seq`` is a 409, never the old answer.

Sharing is fair: one client (an address) may hold at most ``max_instances_per_client`` instances, so others
still get some; a worker serves its requests in arrival order (:class:`FairLock`), and a batch runs in slices
of at most ``batch_slice`` seconds of env time, so one long batch neither holds a worker past
``request_timeout`` nor makes other instances on it wait for the whole batch. A supervisor thread restarts
a dead worker within ``supervise_interval`` seconds, without waiting for a request to find it dead; a create
that meets a dying worker is retried on a live one.

Stopping is the server's job: a worker ignores SIGINT and SIGTERM, so a signal sent to the whole process group
(Ctrl-C, ``systemd``'s ``KillMode=control-group``, ``kill -TERM -PGID``) leaves it serving the requests in
flight while the server drains; :meth:`EnvPool.stop_restarting` (called as the drain starts) keeps the
supervisor from reviving workers from then on, and :meth:`EnvPool.shutdown` stops them.

Example:
    >>> policy = EnvPolicy.from_registry("progpo/ALFWorld-v0")  # doctest: +SKIP
    >>> pool = EnvPool({policy.env_id: policy})  # doctest: +SKIP
    >>> instance_id, meta = pool.create("progpo/ALFWorld-v0", {})  # doctest: +SKIP
    >>> pool.call(instance_id, "reset", {"seed": 0})["observation"][:20]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import pickle
import secrets
import select
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import psutil

from progpo_envs.core.worker_protocol import Reply, Shutdown
from progpo_envs.server.policy import EnvPolicy
from progpo_envs.server.pool_worker import Batch, InstanceCall, Op, worker_main


class ServerError(Exception):
    """An error with the HTTP status it should be answered with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class WorkerStartError(RuntimeError):
    """An env worker could not start (its envs could not be built): the message is one line with the cause
    and, for a full disk or an unwritable cache, the fix (:func:`progpo_base.usage.failure_line`)."""


class FairLock:
    """A lock handed to its waiters in arrival order (``threading.Lock`` lets a releasing thread take it back
    at once, so a loop of short holds, a sliced batch, could starve everyone else).

    Example:
        >>> lock = FairLock()
        >>> with lock:
        ...     lock.acquire(blocking=False)
        False
    """

    def __init__(self):
        self._mutex = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock after the earlier waiters; ``False`` if not ``blocking`` and it is held."""
        with self._mutex:
            if not self._held and not self._waiters:
                self._held = True
                return True
            if not blocking:
                return False
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder that hands the lock over: it stays held
        return True

    def release(self) -> None:
        """Hand the lock to the longest waiter, or free it."""
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._held = False

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


#: Most batch items sent to a worker in one message (it runs fewer if they take longer than a slice).
_MAX_SLICE_ITEMS = 512
#: Ids of instances lost with their worker that are remembered (to answer 410 rather than 404).
_MAX_REMEMBERED_LOST = 1 << 16
_LOST_MESSAGE = "instance lost: its env worker died and was restarted; create a new instance"


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.lock = FairLock()
        self.process: Any = None
        self.conn: Any = None
        self.poller: Any = None
        self.generation = 0
        self.ready = False

    @property
    def alive(self) -> bool:
        return self.ready and self.process is not None and self.process.is_alive()


@dataclasses.dataclass
class _Record:
    env_id: str
    worker: int
    generation: int
    last_used: float
    client: str | None = None


@dataclasses.dataclass
class PoolConfig:
    """How many workers and instances, and when idle instances expire.

    Attributes:
        num_workers: Env worker subprocesses (instances are spread over them).
        max_instances: Live instances at most; creating one more is a 429.
        idle_timeout: Seconds without a request after which an instance is closed.
        request_timeout: Seconds a worker may take for one request before it is killed and restarted.
        startup_timeout: Seconds a worker may take to start (import and warm up its envs).
        mp_context: Multiprocessing start method (default forkserver where available: safe with threads).
        max_instances_per_client: Live instances one client (address) may hold (default: half of
            ``max_instances``, so one client can never take them all).
        batch_slice: Seconds of env time a worker spends on one batch before it serves other requests (the
            rest of the batch follows); a batch is never one long call that could pass ``request_timeout``.
        supervise_interval: Seconds between checks for dead workers (restarted without waiting for traffic).
    """

    num_workers: int = 1
    max_instances: int = 1024
    idle_timeout: float = 600.0
    request_timeout: float = 120.0
    startup_timeout: float = 300.0
    mp_context: str | None = None
    max_instances_per_client: int | None = None
    batch_slice: float = 0.05
    supervise_interval: float = 0.5

    @property
    def client_share(self) -> int:
        """Live instances one client may hold."""
        if self.max_instances_per_client is not None:
            return self.max_instances_per_client
        return max(1, self.max_instances // 2)


def _operation(op: str) -> Op:
    """The :class:`~progpo_envs.server.pool_worker.Op` named ``op`` (400 for any other name)."""
    try:
        return Op(op)
    except ValueError:
        raise ServerError(400, f"unknown operation {op!r}") from None


class EnvPool:
    """Instances of the hosted envs in worker subprocesses (see the module docstring).

    Args:
        policies: Hosted envs by id.
        config: Sizes and timeouts.
    """

    def __init__(self, policies: Mapping[str, EnvPolicy], config: PoolConfig | None = None):
        self.policies = dict(policies)
        self.config = config or PoolConfig()
        if self.config.num_workers < 1 or self.config.max_instances < 1 or self.config.client_share < 1:
            raise ValueError("num_workers, max_instances and max_instances_per_client must be >= 1")
        method = self.config.mp_context or (
            "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        )
        self._ctx = mp.get_context(method)
        self._records: dict[str, _Record] = {}
        self._records_lock = threading.Lock()
        self._workers = [_Worker(i) for i in range(self.config.num_workers)]
        self.counters = {
            "created": 0,
            "closed": 0,
            "expired": 0,
            "lost": 0,
            "steps": 0,
            "resets": 0,
            "worker_restarts": 0,
        }
        self._lost: OrderedDict[str, None] = (
            OrderedDict()
        )  # ids lost with a worker, so they get a 410, not a 404
        self._pending_close: list[tuple[str, _Record]] = []
        self._stopping = threading.Event()  # set when the server starts draining: no more restarts
        self._closed = threading.Event()
        for worker in self._workers:
            with worker.lock:
                self._start(worker)
        self._supervisor = threading.Thread(
            target=self._supervise_loop, name="env-pool-supervisor", daemon=True
        )
        self._supervisor.start()

    # --- workers ---
    def _start(self, worker: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        entry_points = {env_id: p.entry_point for env_id, p in self.policies.items()}
        fixed = {env_id: dict(p.fixed_kwargs) for env_id, p in self.policies.items()}
        process = self._ctx.Process(
            target=worker_main,
            args=(child, entry_points, fixed),
            name=f"env-worker-{worker.index}",
            daemon=True,
        )
        process.start()
        child.close()
        worker.process, worker.conn = process, parent
        worker.poller = select.poll()
        worker.poller.register(parent.fileno(), select.POLLIN)
        if not parent.poll(self.config.startup_timeout):
            process.kill()
            raise WorkerStartError(
                f"env worker {worker.index} did not start within {self.config.startup_timeout}s"
            )
        try:
            reply: Reply = parent.recv()
        except (EOFError, OSError):
            process.join(5)
            raise WorkerStartError(
                f"env worker {worker.index} exited while starting (exit code {process.exitcode})"
            ) from None
        if not reply.ok:
            process.join(5)
            raise WorkerStartError(f"env worker {worker.index} failed to start: {reply.error}")
        worker.generation += 1
        worker.ready = True

    def _restart(self, worker: _Worker, reason: str) -> None:
        """With ``worker.lock`` held: forget its instances, replace the process (unless shutting down)."""
        worker.ready = False
        if self._stopping.is_set():
            raise ServerError(503, "the env server is shutting down")
        print(f"[env-server] restarting env worker {worker.index}: {reason}", file=sys.stderr, flush=True)
        if worker.process is not None and worker.process.is_alive():
            worker.process.kill()
        if worker.process is not None:
            worker.process.join(5)
        with self._records_lock:
            lost = [i for i, r in self._records.items() if r.worker == worker.index]
            for instance_id in lost:
                del self._records[instance_id]
                self._lost[instance_id] = None
            while len(self._lost) > _MAX_REMEMBERED_LOST:
                self._lost.popitem(last=False)
            self.counters["lost"] += len(lost)
            self.counters["worker_restarts"] += 1
        self._start(worker)

    def _send(self, worker: _Worker, message: InstanceCall | Batch) -> None:
        try:  # what Connection.send writes, without its per-message ForkingPickler
            worker.conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, EOFError, OSError, ValueError):
            self._restart(worker, "worker pipe broken")
            raise ServerError(410, "instance lost: its env worker died; create a new instance") from None

    def _receive(self, worker: _Worker) -> Reply:
        try:
            # the worker's own poll object (Connection.poll builds a selector on every call)
            if not worker.poller.poll(1000 * self.config.request_timeout):
                self._restart(worker, "timeout")
                raise ServerError(
                    504,
                    f"the env did not answer within {self.config.request_timeout}s; its worker was "
                    "restarted and its instances are lost",
                )
            return pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError, ConnectionError):
            code = worker.process.exitcode if worker.process is not None else None
            self._restart(worker, f"exit {code}")
            raise ServerError(
                410,
                f"instance lost: its env worker died (exit code {code}) and was restarted; "
                "create a new instance",
            ) from None

    def _request(self, worker: _Worker, message: InstanceCall, generation: int | None = None) -> Reply:
        with worker.lock:
            if generation is not None and generation != worker.generation:
                raise ServerError(410, "instance lost: its env worker was restarted; create a new instance")
            self._send(worker, message)
            return self._receive(worker)

    @staticmethod
    def _unwrap(reply: Reply) -> Any:
        if reply.ok:
            return reply.value
        raise ServerError(reply.status, reply.error)

    # --- instances ---
    def _lookup(self, instance_id: Any) -> _Record:
        if not isinstance(instance_id, str):
            raise ServerError(400, "instance id must be a string")
        with self._records_lock:
            record = self._records.get(instance_id)
            if record is None:
                if instance_id in self._lost:
                    raise ServerError(410, _LOST_MESSAGE)
                raise ServerError(404, "unknown instance (closed, expired or never created)")
            if record.generation != self._workers[record.worker].generation:
                del self._records[instance_id]
                raise ServerError(410, _LOST_MESSAGE)
            record.last_used = time.monotonic()
            return record

    def create(
        self,
        env_id: Any,
        client_kwargs: Any,
        server_kwargs: Mapping[str, Any] | None = None,
        client: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Build an instance; returns its id and metadata (``num_tasks``, ``max_steps``, ...).

        ``server_kwargs`` are set by the server itself (never from a request) and override the operator's: the
        AgentGym routes use them to serve AgentGym's task numbering whatever split the operator hosts.
        ``client`` (the caller's address) is held to ``client_share`` live instances (429 past it); ``None``
        is an in-process caller, held to ``max_instances`` only. A create whose worker dies under it is
        retried on a live worker.
        """
        if not isinstance(env_id, str):
            raise ServerError(400, f"env_id must be a string naming a hosted env, got {env_id!r}")
        if env_id not in self.policies:
            raise ServerError(
                404, f"env {env_id!r} is not hosted here (hosted: {', '.join(sorted(self.policies))})"
            )
        kwargs = {**self.policies[env_id].resolve_kwargs(client_kwargs), **(server_kwargs or {})}
        instance_id = secrets.token_urlsafe(24)
        message = InstanceCall(Op.CREATE, {"instance_id": instance_id, "env_id": env_id, "kwargs": kwargs})
        attempts = len(self._workers) + 1
        for attempt in range(attempts):
            worker, record = self._reserve(instance_id, env_id, client)
            try:
                meta = self._unwrap(self._request(worker, message, record.generation))
                break
            except ServerError as exc:
                with self._records_lock:
                    self._records.pop(instance_id, None)
                if exc.status != 410 or attempt == attempts - 1:
                    raise
                # the worker died under this create (and was restarted): place it again
        with self._records_lock:
            self.counters["created"] += 1
        return instance_id, {"env_id": env_id, **meta}

    def _reserve(self, instance_id: str, env_id: str, client: str | None) -> tuple[_Worker, _Record]:
        """Check the limits, record the instance on the least-loaded live worker (before the slow build)."""
        with self._records_lock:
            if len(self._records) >= self.config.max_instances:
                self._expire_locked()
            if len(self._records) >= self.config.max_instances:
                raise ServerError(
                    429,
                    f"instance limit reached ({self.config.max_instances} live); close instances "
                    "or retry later",
                )
            share = self.config.client_share
            if client is not None and sum(r.client == client for r in self._records.values()) >= share:
                raise ServerError(
                    429,
                    f"this client holds {share} live instances, its share of the server's "
                    f"{self.config.max_instances}; close some or retry later",
                )
            load = self._live_by_worker()
            candidates = [w for w in self._workers if w.alive] or self._workers
            worker = min(candidates, key=lambda w: load[w.index])
            record = _Record(env_id, worker.index, worker.generation, time.monotonic(), client)
            self._records[instance_id] = record
        return worker, record

    def _live_by_worker(self) -> list[int]:
        """Live instances on each worker (``_records_lock`` held): counted, so never out of step."""
        load = [0] * len(self._workers)
        for record in self._records.values():
            load[record.worker] += 1
        return load

    def call(self, instance_id: Any, op: str, args: dict[str, Any], raw: bool = False) -> Any:
        """Run ``op`` (``reset``, ``step``, ``get``) on an instance; its answer, a dict, or with ``raw`` the
        JSON bytes the worker wrote (:func:`~progpo_envs.server.pool_worker.answer_bytes`)."""
        record = self._lookup(instance_id)
        message = InstanceCall(_operation(op), {**args, "instance_id": instance_id}, raw)
        result = self._unwrap(self._request(self._workers[record.worker], message, record.generation))
        self._count(message.op, 1)
        return result

    def batch(self, op: str, items: list[dict[str, Any]], raw: bool = False) -> list[Reply]:
        """Run ``op`` on many instances; returns one worker reply per item, in order (``raw``: each value as
        JSON bytes, as :meth:`call`).

        Each round sends every worker the items still to run on it and reads back what it ran within
        ``batch_slice`` seconds; workers are locked in index order (no deadlock) and all messages are sent
        before any reply is read, so the workers run their parts at the same time. Between rounds the locks
        are let go, so requests waiting for a worker are served in between.
        """
        operation = _operation(op)
        replies: list[Reply | None] = [None] * len(items)
        by_worker: dict[int, list[int]] = {}
        generations: dict[int, int] = {}
        for position, item in enumerate(items):
            try:
                record = self._lookup(item.get("instance_id"))
            except ServerError as exc:
                replies[position] = Reply.failure(exc.message, exc.status)
                continue
            by_worker.setdefault(record.worker, []).append(position)
            generations[position] = record.generation
        while by_worker:  # one slice per worker per round; the locks are let go between rounds
            self._batch_round(operation, items, by_worker, generations, replies, raw)
        self._count(operation, sum(1 for r in replies if r is not None and r.ok))
        return replies  # type: ignore[return-value]

    def _batch_round(
        self,
        op: Op,
        items: list[dict[str, Any]],
        by_worker: dict[int, list[int]],
        generations: dict[int, int],
        replies: list[Reply | None],
        raw: bool = False,
    ) -> None:
        """One round of :meth:`batch`: fills ``replies`` and leaves in ``by_worker`` what is still to run."""
        workers = [self._workers[index] for index in sorted(by_worker)]
        for worker in workers:
            worker.lock.acquire()
        try:
            sent = []
            for worker in workers:
                positions = by_worker.pop(worker.index)
                for p in positions:
                    if generations[p] != worker.generation:
                        replies[p] = Reply.failure("instance lost: its env worker was restarted", 410)
                positions = [p for p in positions if generations[p] == worker.generation]
                if not positions:
                    continue
                calls = [InstanceCall(op, items[p], raw) for p in positions[:_MAX_SLICE_ITEMS]]
                try:
                    self._send(worker, Batch(calls, self.config.batch_slice))
                    sent.append((worker, positions))
                except ServerError as exc:
                    for p in positions:
                        replies[p] = Reply.failure(exc.message, exc.status)
            for worker, positions in sent:
                try:
                    results = self._unwrap(self._receive(worker))
                except ServerError as exc:
                    results = [Reply.failure(exc.message, exc.status)] * len(positions)
                for p, result in zip(positions, results, strict=False):
                    replies[p] = result
                if len(results) < len(positions):
                    by_worker[worker.index] = positions[len(results) :]
        finally:
            for worker in workers:
                worker.lock.release()

    def _count(self, op: Op, n: int) -> None:
        key = {Op.STEP: "steps", Op.RESET: "resets"}.get(op)
        if key and n:
            with self._records_lock:
                self.counters[key] += n

    def has(self, instance_id: str) -> bool:
        """Whether ``instance_id`` is live (without touching its idle clock)."""
        with self._records_lock:
            return instance_id in self._records

    def close_instance(self, instance_id: Any) -> None:
        """Close an instance (404 if unknown)."""
        record = self._lookup(instance_id)
        with self._records_lock:
            if self._records.pop(instance_id, None) is None:
                raise ServerError(404, "unknown instance (closed, expired or never created)")
            self.counters["closed"] += 1
        message = InstanceCall(Op.CLOSE, {"instance_id": instance_id})
        reply = self._request(self._workers[record.worker], message, record.generation)
        if not reply.ok and reply.status != 404:
            raise ServerError(reply.status, reply.error)

    # --- expiry ---
    def _expire_locked(self) -> list[tuple[str, _Record]]:
        """Drop idle records (``_records_lock`` held); the workers are told by :meth:`sweep`."""
        deadline = time.monotonic() - self.config.idle_timeout
        expired = [(i, r) for i, r in self._records.items() if r.last_used < deadline]
        for instance_id, _ in expired:
            del self._records[instance_id]
        self.counters["expired"] += len(expired)
        self._pending_close.extend(expired)
        return expired

    def sweep(self) -> int:
        """Close instances idle for longer than ``idle_timeout``; returns how many expired."""
        with self._records_lock:
            expired = len(self._expire_locked())
            pending, self._pending_close = self._pending_close, []
        for instance_id, record in pending:
            worker = self._workers[record.worker]
            try:
                self._request(worker, InstanceCall(Op.CLOSE, {"instance_id": instance_id}), record.generation)
            except ServerError:
                pass  # the worker died meanwhile: the instance is gone either way
        return expired

    def revive(self) -> int:
        """Restart the workers whose process died; returns how many were restarted.

        A worker in use is left to its user, who meets the death and restarts it (with the right answer for
        its request); the supervisor calls this every ``supervise_interval`` seconds, so an idle server
        becomes ready again on its own.
        """
        restarted = 0
        for worker in self._workers:
            if worker.alive or not worker.lock.acquire(blocking=False):
                continue
            try:
                if not worker.alive and not self._stopping.is_set():
                    code = worker.process.exitcode if worker.process is not None else None
                    self._restart(worker, f"found dead (exit code {code})")
                    restarted += 1
            finally:
                worker.lock.release()
        return restarted

    def _supervise_loop(self) -> None:
        sweep_interval = max(0.05, min(30.0, self.config.idle_timeout / 4))
        next_sweep = time.monotonic() + sweep_interval
        while not self._closed.wait(min(self.config.supervise_interval, sweep_interval)):
            try:
                self.revive()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_interval
                    self.sweep()
            except Exception:  # noqa: BLE001 - the supervisor must outlive any single failure
                traceback.print_exc()

    # --- status ---
    @property
    def ready(self) -> bool:
        """Every worker is up."""
        return all(w.alive for w in self._workers)

    @property
    def live_instances(self) -> int:
        with self._records_lock:
            return len(self._records)

    def worker_pids(self) -> list[int | None]:
        return [w.process.pid if w.process is not None else None for w in self._workers]

    def metrics(self) -> dict[str, Any]:
        """Counters, live instances and each worker's pid, live instances and resident memory."""
        with self._records_lock:
            counters = dict(self.counters)
            live = len(self._records)
            load = self._live_by_worker()
        workers = []
        for worker in self._workers:
            rss = None
            try:
                rss = psutil.Process(worker.process.pid).memory_info().rss
            except (psutil.Error, AttributeError):
                pass
            workers.append(
                {
                    "index": worker.index,
                    "pid": worker.process.pid if worker.process else None,
                    "alive": bool(worker.process and worker.process.is_alive()),
                    "live_instances": load[worker.index],
                    "generation": worker.generation,
                    "rss_bytes": rss,
                }
            )
        return {
            "live_instances": live,
            "max_instances": self.config.max_instances,
            **counters,
            "workers": workers,
        }

    def stop_restarting(self) -> None:
        """From now on a dead worker stays dead (its requests answer 503): the server is draining."""
        self._stopping.set()

    def shutdown(self) -> None:
        """Stop the sweeper and the workers."""
        self._stopping.set()
        self._closed.set()
        for worker in self._workers:
            with worker.lock:
                try:
                    worker.conn.send(Shutdown())
                except (BrokenPipeError, OSError, AttributeError):
                    pass
                if worker.process is not None:
                    worker.process.join(5)
                    if worker.process.is_alive():
                        worker.process.kill()
                        worker.process.join(5)
                worker.ready = False
