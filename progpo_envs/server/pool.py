"""Env instances live in worker subprocesses; the pool routes requests to them and survives their death.

The HTTP front (:mod:`progpo_envs.server.app`) is threaded; the envs are CPU-bound Python, so they run in
``num_workers`` subprocesses (one message at a time each), which also isolates faults: if an env crashes or a
worker is killed, only the instances on that worker are lost (their next request is a 410 with a message), the
worker is restarted, and every other instance keeps serving.

Each instance has an unguessable id (``secrets.token_urlsafe``), is placed on the least-loaded worker, and
expires after ``idle_timeout`` seconds without a request. Mutating calls (reset, step) may carry a ``seq``
number: the worker remembers the last ``seq`` and its reply, so a client that lost a reply can resend the same
call and get the same answer instead of stepping twice (that makes step and reset safe to retry).

Example:
    >>> policy = EnvPolicy.from_registry("progpo/ALFWorld-v0")  # doctest: +SKIP
    >>> pool = EnvPool({policy.env_id: policy})  # doctest: +SKIP
    >>> instance_id, meta = pool.create("progpo/ALFWorld-v0", {})  # doctest: +SKIP
    >>> pool.call(instance_id, "reset", {"seed": 0})["observation"][:20]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import secrets
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import psutil

from progpo_envs.server.codec import encode
from progpo_envs.server.policy import EnvPolicy


class ServerError(Exception):
    """An error with the HTTP status it should be answered with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# --- worker side --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Instance:
    env: Any
    observation: str | None = None
    info: dict | None = None
    last_seq: int = 0
    last_reply: Any = None


def _error(status: int, message: str) -> tuple:
    return ("error", status, message)


def _env_meta(env: Any) -> dict[str, Any]:
    unwrapped = env.unwrapped
    meta: dict[str, Any] = {}
    for name in ("num_tasks", "max_steps", "max_action_length"):
        try:
            value = getattr(unwrapped, name)
        except Exception:  # noqa: BLE001 - a property may need a reset first; the meta is best-effort
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            meta[name] = value
    space = getattr(unwrapped, "observation_space", None)
    if hasattr(space, "max_length"):
        meta["max_observation_length"] = int(space.max_length)
    return meta


def _run_op(instances: dict[str, _Instance], creators: Mapping[str, Any], op: str, args: dict) -> tuple:
    """Run one operation in the worker; returns ``("ok", payload)`` or ``("error", status, message)``."""
    if op == "create":
        env = creators[args["env_id"]](**args["kwargs"])
        instances[args["instance_id"]] = _Instance(env)
        return ("ok", _env_meta(env))
    instance = instances.get(args["instance_id"])
    if instance is None:
        return _error(404, "unknown instance (closed, expired or never created)")
    if op == "close":
        del instances[args["instance_id"]]
        instance.env.close()
        return ("ok", None)
    if op == "get":
        if instance.info is None:
            return _error(409, "the instance has not been reset yet")
        return ("ok", {"observation": instance.observation, "info": encode(instance.info)})
    if op in ("reset", "step"):
        seq = args.get("seq")
        if seq is not None:
            if seq == instance.last_seq and instance.last_reply is not None:
                return instance.last_reply  # a retried call: same answer, no second step
            if seq != instance.last_seq + 1:
                return _error(409, f"out-of-order call: seq {seq}, expected {instance.last_seq + 1}")
        if op == "reset":
            observation, info = instance.env.reset(seed=args.get("seed"), options=args.get("options"))
            payload = {"observation": observation, "info": encode(info)}
        else:
            if instance.info is None:
                return _error(409, "call reset before step")
            observation, reward, terminated, truncated, info = instance.env.step(args["action"])
            payload = {
                "observation": observation,
                "reward": encode(float(reward)),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": encode(info),
            }
        instance.observation, instance.info = observation, info
        reply = ("ok", payload)
        if seq is not None:
            instance.last_seq, instance.last_reply = seq, reply
        return reply
    return _error(400, f"unknown operation {op!r}")


def _safe_op(instances: dict[str, _Instance], creators: Mapping[str, Any], op: str, args: dict) -> tuple:
    try:
        return _run_op(instances, creators, op, args)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        # Bad input reaching the env (task_index out of range, a kwarg of the wrong type): the caller's fault.
        return _error(400, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - any env failure becomes an answer, never a dead worker
        name = type(exc).__name__
        if name == "ResetNeeded":
            return _error(409, str(exc))
        traceback.print_exc()  # the details go to the server log, the client gets the exception's message
        return _error(500, f"the env raised {name}: {exc}")


def _worker_main(conn, entry_points: dict[str, str], fixed_kwargs: dict[str, dict]) -> None:
    """Worker loop: answer ``(op, args)`` messages; ``("batch", [(op, args), ...])`` answers a list."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        from gymnasium.envs.registration import load_env_creator

        import progpo_envs  # noqa: F401  (registers the ids, as the parent did)

        creators = {env_id: load_env_creator(ep) for env_id, ep in entry_points.items()}
        for (
            env_id,
            creator,
        ) in creators.items():  # warm-up: first construction loads shared data (catalog, index)
            creator(**fixed_kwargs[env_id]).close()
        conn.send(("ok", os.getpid()))
    except Exception:  # noqa: BLE001 - report start-up failures to the parent instead of dying silently
        conn.send(("error", 500, traceback.format_exc()))
        return
    instances: dict[str, _Instance] = {}
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if op == "shutdown":
            break
        if op == "batch":
            reply: Any = (
                "ok",
                [_safe_op(instances, creators, sub_op, sub_args) for sub_op, sub_args in args],
            )
        elif op == "count":
            reply = ("ok", len(instances))
        else:
            reply = _safe_op(instances, creators, op, args)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    for instance in instances.values():
        try:
            instance.env.close()
        except Exception:  # noqa: BLE001,S110 - shutting down; nothing to report to
            pass


# --- parent side --------------------------------------------------------------------------------------------

#: Ids of instances lost with their worker that are remembered (to answer 410 rather than 404).
_MAX_REMEMBERED_LOST = 1 << 16
_LOST_MESSAGE = "instance lost: its env worker died and was restarted; create a new instance"


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.lock = threading.Lock()
        self.process: Any = None
        self.conn: Any = None
        self.generation = 0
        self.live = 0
        self.ready = False


@dataclasses.dataclass
class _Record:
    env_id: str
    worker: int
    generation: int
    last_used: float


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
    """

    num_workers: int = 1
    max_instances: int = 1024
    idle_timeout: float = 600.0
    request_timeout: float = 120.0
    startup_timeout: float = 300.0
    mp_context: str | None = None


class EnvPool:
    """Instances of the hosted envs in worker subprocesses (see the module docstring).

    Args:
        policies: Hosted envs by id.
        config: Sizes and timeouts.
    """

    def __init__(self, policies: Mapping[str, EnvPolicy], config: PoolConfig | None = None):
        self.policies = dict(policies)
        self.config = config or PoolConfig()
        if self.config.num_workers < 1 or self.config.max_instances < 1:
            raise ValueError("num_workers and max_instances must be >= 1")
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
        self._closed = threading.Event()
        for worker in self._workers:
            with worker.lock:
                self._start(worker)
        self._sweeper = threading.Thread(target=self._sweep_loop, name="env-pool-sweeper", daemon=True)
        self._sweeper.start()

    # --- workers ---
    def _start(self, worker: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        entry_points = {env_id: p.entry_point for env_id, p in self.policies.items()}
        fixed = {env_id: dict(p.fixed_kwargs) for env_id, p in self.policies.items()}
        process = self._ctx.Process(
            target=_worker_main,
            args=(child, entry_points, fixed),
            name=f"env-worker-{worker.index}",
            daemon=True,
        )
        process.start()
        child.close()
        worker.process, worker.conn = process, parent
        if not parent.poll(self.config.startup_timeout):
            process.kill()
            raise RuntimeError(
                f"env worker {worker.index} did not start within {self.config.startup_timeout}s"
            )
        try:
            status, *payload = parent.recv()
        except (EOFError, OSError):
            process.join(5)
            raise RuntimeError(
                f"env worker {worker.index} exited while starting (exit code {process.exitcode})"
            ) from None
        if status != "ok":
            process.join(5)
            raise RuntimeError(f"env worker {worker.index} failed to start:\n{payload[-1]}")
        worker.generation += 1
        worker.live = 0
        worker.ready = True

    def _restart(self, worker: _Worker, reason: str) -> None:
        """With ``worker.lock`` held: forget its instances, replace the process (unless shutting down)."""
        worker.ready = False
        if self._closed.is_set():
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

    def _send(self, worker: _Worker, message: tuple) -> None:
        try:
            worker.conn.send(message)
        except (BrokenPipeError, EOFError, OSError, ValueError):
            self._restart(worker, "worker pipe broken")
            raise ServerError(410, "instance lost: its env worker died; create a new instance") from None

    def _receive(self, worker: _Worker) -> Any:
        try:
            if not worker.conn.poll(self.config.request_timeout):
                self._restart(worker, "timeout")
                raise ServerError(
                    504,
                    f"the env did not answer within {self.config.request_timeout}s; its worker was "
                    "restarted and its instances are lost",
                )
            return worker.conn.recv()
        except (EOFError, OSError, ConnectionError):
            code = worker.process.exitcode if worker.process is not None else None
            self._restart(worker, f"exit {code}")
            raise ServerError(
                410,
                f"instance lost: its env worker died (exit code {code}) and was restarted; "
                "create a new instance",
            ) from None

    def _request(self, worker: _Worker, message: tuple, generation: int | None = None) -> Any:
        with worker.lock:
            if generation is not None and generation != worker.generation:
                raise ServerError(410, "instance lost: its env worker was restarted; create a new instance")
            self._send(worker, message)
            return self._receive(worker)

    @staticmethod
    def _unwrap(reply: tuple) -> Any:
        if reply[0] == "ok":
            return reply[1]
        raise ServerError(reply[1], reply[2])

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

    def create(self, env_id: Any, client_kwargs: Any) -> tuple[str, dict[str, Any]]:
        """Build an instance; returns its id and metadata (``num_tasks``, ``max_steps``, ...)."""
        if not isinstance(env_id, str):
            raise ServerError(400, f"env_id must be a string naming a hosted env, got {env_id!r}")
        if env_id not in self.policies:
            raise ServerError(
                404, f"env {env_id!r} is not hosted here (hosted: {', '.join(sorted(self.policies))})"
            )
        kwargs = self.policies[env_id].resolve_kwargs(client_kwargs)
        instance_id = secrets.token_urlsafe(24)
        with self._records_lock:
            if len(self._records) >= self.config.max_instances:
                self._expire_locked()
            if len(self._records) >= self.config.max_instances:
                raise ServerError(
                    429,
                    f"instance limit reached ({self.config.max_instances} live); close instances "
                    "or retry later",
                )
            worker = min(self._workers, key=lambda w: w.live)
            worker.live += 1  # reserve the slot before the (slow) construction
            record = _Record(env_id, worker.index, worker.generation, time.monotonic())
            self._records[instance_id] = record
        try:
            meta = self._unwrap(
                self._request(
                    worker,
                    ("create", {"instance_id": instance_id, "env_id": env_id, "kwargs": kwargs}),
                    record.generation,
                )
            )
        except ServerError:
            with self._records_lock:
                if self._records.pop(instance_id, None) is not None:
                    worker.live -= 1
            raise
        with self._records_lock:
            self.counters["created"] += 1
        return instance_id, {"env_id": env_id, **meta}

    def call(self, instance_id: Any, op: str, args: dict[str, Any]) -> Any:
        """Run ``op`` (``reset``, ``step``, ``get``) on an instance."""
        record = self._lookup(instance_id)
        reply = self._request(
            self._workers[record.worker], (op, {**args, "instance_id": instance_id}), record.generation
        )
        result = self._unwrap(reply)
        self._count(op, 1)
        return result

    def batch(self, op: str, items: list[dict[str, Any]]) -> list[tuple]:
        """Run ``op`` on many instances, one message per worker; returns one raw reply per item, in order.

        Workers are locked in index order (no deadlock) and all messages are sent before any reply is read, so
        the workers run their parts at the same time.
        """
        replies: list[tuple | None] = [None] * len(items)
        by_worker: dict[int, list[int]] = {}
        generations: dict[int, int] = {}
        for position, item in enumerate(items):
            try:
                record = self._lookup(item.get("instance_id"))
            except ServerError as exc:
                replies[position] = _error(exc.status, exc.message)
                continue
            by_worker.setdefault(record.worker, []).append(position)
            generations[position] = record.generation
        workers = [self._workers[index] for index in sorted(by_worker)]
        for worker in workers:
            worker.lock.acquire()
        try:
            sent = []
            for worker in workers:
                positions = [p for p in by_worker[worker.index] if generations[p] == worker.generation]
                for p in by_worker[worker.index]:
                    if generations[p] != worker.generation:
                        replies[p] = _error(410, "instance lost: its env worker was restarted")
                if not positions:
                    continue
                try:
                    self._send(worker, ("batch", [(op, items[p]) for p in positions]))
                    sent.append((worker, positions))
                except ServerError as exc:
                    for p in positions:
                        replies[p] = _error(exc.status, exc.message)
            for worker, positions in sent:
                try:
                    results = self._unwrap(self._receive(worker))
                except ServerError as exc:
                    results = [_error(exc.status, exc.message)] * len(positions)
                for p, result in zip(positions, results, strict=True):
                    replies[p] = result
        finally:
            for worker in workers:
                worker.lock.release()
        self._count(op, sum(1 for r in replies if r is not None and r[0] == "ok"))
        return replies  # type: ignore[return-value]

    def _count(self, op: str, n: int) -> None:
        key = {"step": "steps", "reset": "resets"}.get(op)
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
            self._workers[record.worker].live -= 1
            self.counters["closed"] += 1
        reply = self._request(
            self._workers[record.worker], ("close", {"instance_id": instance_id}), record.generation
        )
        if reply[0] != "ok" and reply[1] != 404:
            raise ServerError(reply[1], reply[2])

    # --- expiry ---
    def _expire_locked(self) -> list[tuple[str, _Record]]:
        """Drop idle records (``_records_lock`` held); the workers are told by :meth:`sweep`."""
        deadline = time.monotonic() - self.config.idle_timeout
        expired = [(i, r) for i, r in self._records.items() if r.last_used < deadline]
        for instance_id, record in expired:
            del self._records[instance_id]
            self._workers[record.worker].live -= 1
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
                self._request(worker, ("close", {"instance_id": instance_id}), record.generation)
            except ServerError:
                pass  # the worker died meanwhile: the instance is gone either way
        return expired

    def _sweep_loop(self) -> None:
        interval = max(0.05, min(30.0, self.config.idle_timeout / 4))
        while not self._closed.wait(interval):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweeper must outlive any single failure
                traceback.print_exc()

    # --- status ---
    @property
    def ready(self) -> bool:
        """Every worker is up."""
        return all(w.ready and w.process is not None and w.process.is_alive() for w in self._workers)

    @property
    def live_instances(self) -> int:
        with self._records_lock:
            return len(self._records)

    def worker_pids(self) -> list[int | None]:
        return [w.process.pid if w.process is not None else None for w in self._workers]

    def metrics(self) -> dict[str, Any]:
        """Counters, live instances and each worker's pid, live instances and resident memory."""
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
                    "live_instances": worker.live,
                    "generation": worker.generation,
                    "rss_bytes": rss,
                }
            )
        with self._records_lock:
            counters = dict(self.counters)
            live = len(self._records)
        return {
            "live_instances": live,
            "max_instances": self.config.max_instances,
            **counters,
            "workers": workers,
        }

    def shutdown(self) -> None:
        """Stop the sweeper and the workers."""
        self._closed.set()
        for worker in self._workers:
            with worker.lock:
                try:
                    worker.conn.send(("shutdown", None))
                except (BrokenPipeError, OSError, AttributeError):
                    pass
                if worker.process is not None:
                    worker.process.join(5)
                    if worker.process.is_alive():
                        worker.process.kill()
                        worker.process.join(5)
                worker.ready = False
