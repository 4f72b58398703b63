"""The env server's worker subprocess: it holds env instances by id and answers the pool's messages.

The pool (:mod:`progpo_envs.server.pool`) sends one message at a time and reads one
:class:`~progpo_envs.core.worker_protocol.Reply` back:

* :class:`InstanceCall` — one :class:`Op` on one instance (``args`` carries its ``instance_id``); an error
  is a reply with the HTTP status it is answered with (400 bad input, 404 unknown instance, 409 out of
  order, 500 an env fault), never a dead worker. With ``raw`` the value of a get, reset or step is its JSON
  text as bytes (:func:`answer_bytes`), the very bytes the server sends on: the server neither unpickles a
  dict nor encodes it again;
* :class:`Batch` — instance calls run in order until ``budget`` seconds are spent (one at least); the reply's
  value is the replies of the calls it ran, a prefix (the pool sends the rest again);
* :class:`~progpo_envs.core.worker_protocol.Shutdown` — close every instance and exit (not answered).

The expert never rides on what a policy reads. An env made with ``expert=True`` (the operator's choice) puts
its next command in ``info["expert_action"]``; the worker takes it out of every reset, step and get answer
(the bytes every door sends on: the native routes, the stream door, AgentGym's routes, OpenEnv's
observations) and keeps it on the instance, where only :attr:`Op.EXPERT` reads it: its own route on each
door (``GET /instances/<id>/expert``, OpenEnv's ``GET /expert``), which only a caller that asks for the
expert (``progpo eval --agent expert``, an SFT warm start) calls.

A reset or step may carry a ``seq`` number: the worker remembers each instance's last ``seq``, the call and
its reply, so the same call sent again is answered again without stepping twice, and a different call with a
used ``seq`` is a 409.

Example:
    >>> from progpo_envs.testing import CounterEnv
    >>> worker = EnvWorker({"toy": CounterEnv})
    >>> worker.handle(InstanceCall(Op.CREATE, {"instance_id": "a", "env_id": "toy", "kwargs": {}})).value
    {'num_tasks': 5, 'max_steps': 8, 'max_action_length': 4096, 'max_observation_length': 1048576}
    >>> worker.handle(InstanceCall(Op.STEP, {"instance_id": "a", "action": "+1"})).error
    'call reset before step'
    >>> worker.handle("count").error
    "unknown worker message 'count'"
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from progpo_base.usage import failure_line
from progpo_envs.core.errors import EnvDataError
from progpo_envs.core.worker_protocol import Reply, Reset, Step, apply_command, serve_requests
from progpo_envs.server.codec import dumps, encode
from webshop_server.serving import HeapTrimmer

_UNKNOWN_INSTANCE = "unknown instance (closed, expired or never created)"
#: The info key of the expert's next command, which no answer but :attr:`Op.EXPERT`'s carries.
EXPERT_KEY = "expert_action"
_NO_EXPERT = (
    "this env has no expert: the server's operator turns it on (--env-kwargs '<env id>={\"expert\": true}')"
)


class Op(str, enum.Enum):
    """What an :class:`InstanceCall` does to its instance."""

    CREATE = "create"  # args: env_id, kwargs
    CLOSE = "close"
    GET = "get"  # the last observation and info
    RESET = "reset"  # args: seed, options, seq
    STEP = "step"  # args: action, seq
    EXPERT = "expert"  # the expert's next command, kept out of every other answer


@dataclasses.dataclass(frozen=True)
class InstanceCall:
    """``op`` on the instance ``args["instance_id"]``, with the rest of ``args`` as its arguments; ``raw``:
    the answer of a get, reset or step as JSON bytes (:func:`answer_bytes`) instead of a dict."""

    op: Op
    args: dict[str, Any]
    raw: bool = False


@dataclasses.dataclass(frozen=True)
class Batch:
    """Run ``calls`` in order for at most ``budget`` seconds (one call at least)."""

    calls: list[InstanceCall]
    budget: float


@dataclasses.dataclass
class Instance:
    """One env instance and what it last answered (for ``GET`` and for ``seq`` replays: ``last_reply`` holds
    the last reset's or step's answer as a dict, its values encoded); ``expert``: the expert's next command
    after that answer, kept apart from it (``has_expert``: the env reports one)."""

    env: Any
    observation: str | None = None
    info: dict | None = None
    expert: str | None = None
    has_expert: bool = False
    last_seq: int = 0
    last_call: str | None = None
    last_reply: Reply | None = None


def call_key(op: Op, args: Mapping[str, Any]) -> str:
    """What makes two calls the same call (the instance and ``seq`` aside), as canonical JSON."""
    return dumps([op.value, {k: v for k, v in sorted(args.items()) if k not in ("instance_id", "seq")}])


def answer_bytes(answer: Mapping[str, Any]) -> bytes:
    """An answer (values already :func:`~progpo_envs.server.codec.encode` d) as the JSON the server sends:
    compact, strict (no NaN), ASCII (``\\u`` escapes, as Flask's ``jsonify`` writes it)."""
    return _ENCODER.encode(answer).encode("ascii")


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def env_meta(env: Any) -> dict[str, Any]:
    """What a create answers: the env's ``num_tasks``, ``max_steps``, ``max_action_length``,
    ``max_observation_length`` and ``prompt_style``, where it has them."""
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
    style = getattr(unwrapped, "metadata", {}).get("prompt_style")
    if isinstance(style, str):  # the client's prompts are in the hosted env's style
        meta["prompt_style"] = style
    return meta


#: Messages of the env data errors this worker has logged (each is logged once, answered every time).
_REPORTED_DATA_ERRORS: set[str] = set()


class EnvWorker:
    """The instances of one worker and the answer to each message (see the module docstring).

    Args:
        creators: The env constructor of each hosted env id.
    """

    def __init__(self, creators: Mapping[str, Any]):
        self.creators = creators
        self.instances: dict[str, Instance] = {}

    def handle(self, message: Any) -> Reply:
        """The reply to one message from the pool."""
        if isinstance(message, InstanceCall):
            return self.safe_call(message)
        if isinstance(message, Batch):
            return Reply.success(self.run_slice(message.calls, message.budget))
        return Reply.failure(f"unknown worker message {message!r}", status=500)

    def run_slice(self, calls: list[InstanceCall], budget: float) -> list[Reply]:
        """Run ``calls`` in order until ``budget`` seconds are spent (one call at least); a reply per call
        run."""
        deadline = time.monotonic() + budget
        replies = []
        for call in calls:
            replies.append(self.safe_call(call))
            if time.monotonic() >= deadline:
                break
        return replies

    def safe_call(self, call: InstanceCall) -> Reply:
        """:meth:`run_call`, every exception turned into a reply (bad input 400, damaged data 500, ...)."""
        try:
            return self.run_call(call.op, call.args, call.raw)
        except EnvDataError as exc:  # a damaged file on the server's side: a server fault that names the file
            if str(exc) not in _REPORTED_DATA_ERRORS:
                _REPORTED_DATA_ERRORS.add(str(exc))
                print(f"[env-server] env data error: {exc}", file=sys.stderr, flush=True)
            return Reply.failure(f"the server's env data is damaged: {exc}", status=500)
        except gym.error.ResetNeeded as exc:
            return Reply.failure(str(exc), status=409)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
            # Bad input reaching the env (task_index out of range, a kwarg of the wrong type): the caller's
            # fault.
            return Reply.failure(f"{type(exc).__name__}: {exc}", status=400)
        except Exception as exc:  # noqa: BLE001 - any env failure becomes an answer, never a dead worker
            traceback.print_exc()  # the details go to the server log, the client gets the exception's message
            return Reply.failure(f"the env raised {type(exc).__name__}: {exc}", status=500)

    def run_call(self, op: Op, args: dict[str, Any], raw: bool = False) -> Reply:
        """Run one operation (``raw``: see :class:`InstanceCall`); exceptions of the env propagate
        (:meth:`safe_call` answers them)."""
        if op is Op.CREATE:
            env = self.creators[args["env_id"]](**args["kwargs"])
            self.instances[args["instance_id"]] = Instance(env)
            return Reply.success(env_meta(env))
        instance = self.instances.get(args["instance_id"])
        if instance is None:
            return Reply.failure(_UNKNOWN_INSTANCE, status=404)
        if op is Op.CLOSE:
            del self.instances[args["instance_id"]]
            instance.env.close()
            return Reply.success()
        if op is Op.GET:
            if instance.info is None:
                return Reply.failure("the instance has not been reset yet", status=409)
            answer = {"observation": instance.observation, "info": encode(instance.info)}
            return Reply.success(answer_bytes(answer) if raw else answer)
        if op in (Op.RESET, Op.STEP):
            return self._mutate(instance, op, args, raw)
        if op is Op.EXPERT:
            if instance.info is None:
                return Reply.failure("the instance has not been reset yet", status=409)
            if not instance.has_expert:
                return Reply.failure(_NO_EXPERT, status=409)
            return Reply.success({EXPERT_KEY: instance.expert})
        return Reply.failure(f"unknown operation {op!r}", status=400)

    def _mutate(self, instance: Instance, op: Op, args: dict[str, Any], raw: bool = False) -> Reply:
        """A reset or step, replayed instead of run again when it repeats the last ``seq``."""
        seq = args.get("seq")
        call = call_key(op, args) if seq is not None else None
        if seq is not None:
            if seq == instance.last_seq and instance.last_reply is not None:
                if call == instance.last_call:  # a retried call: same answer, no second step
                    last = instance.last_reply
                    return Reply.success(answer_bytes(last.value)) if raw else last
                expected = instance.last_seq + 1
                return Reply.failure(
                    f"seq {seq} was already used by a different call; the next is {expected}", status=409
                )
            if seq != instance.last_seq + 1:
                expected = instance.last_seq + 1
                return Reply.failure(f"out-of-order call: seq {seq}, expected {expected}", status=409)
        if op is Op.RESET:
            observation, info = apply_command(instance.env, Reset(args.get("seed"), args.get("options")))
            info = self._keep_expert(instance, info)
            payload = {"observation": observation, "info": encode(info)}
        else:
            if instance.info is None:
                return Reply.failure("call reset before step", status=409)
            step = apply_command(instance.env, Step(args["action"]))
            observation, reward, terminated, truncated, info = step
            info = self._keep_expert(instance, info)
            payload = {
                "observation": observation,
                "reward": encode(float(reward)),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": encode(info),
            }
        instance.observation, instance.info = observation, info
        reply = Reply.success(payload)
        if seq is not None:
            instance.last_seq, instance.last_call, instance.last_reply = seq, call, reply
        return Reply.success(answer_bytes(payload)) if raw else reply

    @staticmethod
    def _keep_expert(instance: Instance, info: dict) -> dict:
        """``info`` without the expert's command, which the instance keeps for :attr:`Op.EXPERT`."""
        instance.has_expert = EXPERT_KEY in info
        if not instance.has_expert:
            instance.expert = None
            return info
        info = dict(info)
        instance.expert = info.pop(EXPERT_KEY)
        return info

    def close(self) -> None:
        """Close every instance (shutting down: a failing close is passed over)."""
        for instance in self.instances.values():
            try:
                instance.env.close()
            except Exception:  # noqa: BLE001,S110 - shutting down; nothing to report to
                pass


def worker_main(conn, entry_points: dict[str, str], fixed_kwargs: dict[str, dict]) -> None:
    """The subprocess: load and warm up the hosted envs, answer ``Reply.success(pid)`` (or the start-up
    failure in one line), then serve the pool's messages until
    :class:`~progpo_envs.core.worker_protocol.Shutdown` or the pipe closes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent drains and then stops this worker
        signal.signal(sig, signal.SIG_IGN)
    try:
        creators = {env_id: load_env_creator(ep) for env_id, ep in entry_points.items()}
        # warm-up: the first construction loads the shared data (catalog, index), and an env that can load
        # more of what its instances share (ALFWorld: every game of a small split) does it now, so the
        # worker's memory reaches its plateau before it serves (not over the first half of a run)
        for env_id, creator in creators.items():
            env = creator(**fixed_kwargs[env_id])
            warm_up = getattr(env, "warm_up", None)
            if callable(warm_up):
                warm_up()
            env.close()
        conn.send(Reply.success(os.getpid()))
    except Exception as exc:  # noqa: BLE001 - report start-up failures to the parent instead of dying silently
        conn.send(Reply.failure(failure_line(exc), status=500))
        return
    worker = EnvWorker(creators)
    trimmer = HeapTrimmer()  # the heap's free pages back to the system every 10 s (not its high-water mark)

    def handle(message: Any) -> Reply:
        reply = worker.handle(message)
        trimmer.tick()
        return reply

    serve_requests(conn, handle)
    worker.close()
