"""The one protocol between an env's owner and the worker that runs it: commands, replies, backends.

Three places run envs for someone else: the group vector env's backends (in-process or in worker
subprocesses, :mod:`progpo_envs.core.vector`), the ``progpo/Remote-v0`` client's batched backend
(:mod:`progpo_envs.server.remote`) and the env server's worker subprocesses
(:mod:`progpo_envs.server.pool_worker`). They share this module's types:

* the commands one env copy runs, :class:`Reset`, :class:`Step` and :class:`Call` (:func:`apply_command`
  runs one on an env; anything else is an :class:`UnknownCommandError`);
* :class:`Reply`, a worker's answer to one message: ``ok`` with a ``value``, or not ``ok`` with an ``error``
  message (and, where the error has one, the HTTP ``status`` it is answered with);
* :class:`Shutdown`, the message that ends a worker loop, and :func:`serve_requests`, that loop;
* :class:`VectorBackend`, what a group vector env needs of wherever its copies run: reset, step and call
  every copy (or some of them) and close.

Example:
    >>> from progpo_envs.testing import CounterEnv
    >>> env = CounterEnv()
    >>> observation, info = apply_command(env, Reset(seed=0))
    >>> apply_command(env, Call("max_steps"))
    8
    >>> Reply.failure("unknown instance", status=404)
    Reply(ok=False, value=None, status=404, error='unknown instance')
    >>> apply_command(env, "reset")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    progpo_envs.core.worker_protocol.UnknownCommandError: unknown command 'reset' (a str); ...
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym


@dataclasses.dataclass(frozen=True)
class Reset:
    """``env.reset(seed=seed, options=options)``."""

    seed: int | None = None
    options: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """``env.step(action)``."""

    action: Any


@dataclasses.dataclass(frozen=True)
class Call:
    """Method ``name`` of the unwrapped env called with ``args``/``kwargs``, or attribute ``name`` read."""

    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


#: A command one env copy runs.
EnvCommand = Reset | Step | Call


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """The message that ends a worker's loop (:func:`serve_requests`)."""


class UnknownCommandError(TypeError):
    """A message that is none of the commands a worker runs (a programming error on the sending side)."""


def apply_command(env: gym.Env, command: EnvCommand) -> Any:
    """Run ``command`` on ``env``; its result (what ``reset``/``step``/the call returns).

    Raises:
        UnknownCommandError: ``command`` is not a :class:`Reset`, :class:`Step` or :class:`Call`.
    """
    if isinstance(command, Step):
        return env.step(command.action)
    if isinstance(command, Reset):
        return env.reset(seed=command.seed, options=command.options)
    if isinstance(command, Call):
        attr = getattr(env.unwrapped, command.name)
        return attr(*command.args, **command.kwargs) if callable(attr) else attr
    raise UnknownCommandError(
        f"unknown command {command!r} (a {type(command).__name__}); a worker runs Reset, Step or Call"
    )


@dataclasses.dataclass(frozen=True)
class Reply:
    """A worker's answer to one message.

    Attributes:
        ok: Whether the message was carried out.
        value: What it gave (``ok`` only).
        status: The HTTP status the error is answered with, where the worker's caller is a server (not
            ``ok`` only; ``None`` for a worker whose errors are tracebacks).
        error: What went wrong (not ``ok`` only).
    """

    ok: bool
    value: Any = None
    status: int | None = None
    error: str | None = None

    @classmethod
    def success(cls, value: Any = None) -> Reply:
        """The message was carried out and gave ``value``."""
        return cls(True, value)

    @classmethod
    def failure(cls, error: str, status: int | None = None) -> Reply:
        """The message failed with ``error`` (answered with ``status``, if given)."""
        return cls(False, None, status, error)


def serve_requests(conn: Any, handle: Callable[[Any], Reply]) -> bool:
    """A worker's loop: answer each message on ``conn`` with ``handle(message)``, until :class:`Shutdown`.

    ``handle`` turns every failure into a :class:`Reply` (a worker never dies of a bad message). Returns
    ``True`` when a :class:`Shutdown` came (not answered: the caller cleans up and may answer it), ``False``
    when the pipe closed first (the parent is gone).
    """
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return False
        if isinstance(message, Shutdown):
            return True
        try:  # what Connection.send writes, without its per-message ForkingPickler
            conn.send_bytes(pickle.dumps(handle(message), pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            return False


#: What a reset returns: the observation and the info.
ResetResult = tuple[Any, dict[str, Any]]
#: What a step returns: observation, reward, terminated, truncated, info.
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]


@runtime_checkable
class VectorBackend(Protocol):
    """Where the copies of a :class:`~progpo_envs.core.vector.GroupVectorEnv` run.

    ``copies`` (indices in ``0..num_envs-1``, distinct) names the copies a reset or step is for, in the order
    of their seeds/actions; ``None`` is every copy in order. Results come in the same order.
    """

    def reset(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        copies: Sequence[int] | None = None,
    ) -> list[ResetResult]:
        """Reset the copies, ``seeds[k]`` and ``options[k]`` for the ``k``-th."""
        ...

    def step(self, actions: Sequence[Any], copies: Sequence[int] | None = None) -> list[StepResult]:
        """Step the copies, ``actions[k]`` for the ``k``-th."""
        ...

    def call(self, name: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """:class:`Call` ``name`` on every copy; one result per copy."""
        ...

    def close(self) -> None:
        """Close every copy and stop the workers, if any."""
        ...
