"""Group vectorisation: ``B`` task groups of ``G`` copies of one task, stepped in-process or in subprocesses.

Group RL (GRPO, GiGPO, ProGPO, ...) compares ``G`` rollouts that start from the same task.
:class:`GroupVectorEnv` holds ``num_envs = B·G`` copies of a text env; copy ``i`` belongs to group ``i // G``,
and every copy of a group is reset with the same seed (hence the same task and the same randomisation):

* ``reset(seed=s)`` gives copy ``i`` the seed ``s + i // G``; ``reset(seed=[s_0, ..., s_{B-1}])`` (Gymnasium's
  list form, one seed per group) gives it ``s_{i // G}``;
* ``reset(seed=None)`` draws one seed per group from the vector env's own generator (seeded by the last seeded
  reset);
* ``reset(options={"task_indices": [t_0, ..., t_{B-1}]})`` plays task ``t_b`` in group ``b``;
  ``options={"task_index": t}`` plays task ``t`` in every group; other option keys reach every copy.

Autoreset is disabled (:attr:`gymnasium.vector.AutoresetMode.DISABLED`): a group rollout runs until every copy
is done, and a copy whose episode ended keeps returning its final observation with
``terminated``/``truncated`` set and reward 0, without stepping its engine (that latch lives in
:class:`~progpo_envs.core.text_env.TextEnv`). Call ``reset`` to start the next batch of groups. ``info`` is
Gymnasium's dict of arrays (with ``_key`` masks) and carries each copy's ``group_id`` and ``task_id`` besides
the env's own entries. ``step_copies``/``reset_copies`` return the same with one plain info dict per copy
instead, exactly as :func:`~progpo_envs.core.vector_info.unbatch_info` takes the batched info apart but
without building it (batching costs more than a step of a fast env). :func:`reset_per_copy` and
:func:`step_per_copy` give per-copy infos from any vector env (this one's shortcut, or batching undone).

Gymnasium's ``make_vec(..., vectorization_mode="sync"|"async")`` always builds its own Sync/AsyncVectorEnv,
whose copies are seeded ``s + i`` and autoreset by default, so it cannot form groups. Registered ``progpo/*``
envs therefore use this class as their ``vector_entry_point`` (the default of ``make_vec``) and take the
backend as ``vector_mode``:

* ``"sync"``: every copy in this process;
* ``"async"``: copies split into contiguous shards across ``num_workers`` subprocesses (default: one per CPU
  core, at most one per copy), so several cores step at once. Each worker steps its whole shard per message.

Either is a :class:`~progpo_envs.core.worker_protocol.VectorBackend` (reset, step, call, close); a subclass
plugs in its own by overriding :meth:`GroupVectorEnv.make_backend` (``progpo/Remote-v0``'s batched requests).

Example:
    >>> import gymnasium as gym, progpo_envs
    >>> envs = gym.make_vec("progpo/ALFWorld-v0", num_envs=4, group_size=2)  # doctest: +SKIP
    >>> obs, info = envs.reset(seed=0)  # doctest: +SKIP
    >>> info["group_id"].tolist()  # doctest: +SKIP
    [0, 0, 1, 1]
"""

from __future__ import annotations

import dataclasses
import enum
import multiprocessing as mp
import os
import traceback
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from progpo_envs.core.vector_info import unbatch_copy_infos, unbatch_info
from progpo_envs.core.worker_protocol import (
    Call,
    EnvCommand,
    Reply,
    Reset,
    ResetResult,
    Shutdown,
    Step,
    StepResult,
    VectorBackend,
    apply_command,
    serve_requests,
)


class VectorMode(str, enum.Enum):
    """Where the copies of a :class:`GroupVectorEnv` run."""

    SYNC = "sync"
    ASYNC = "async"


def _make_env(entry_point: str, env_kwargs: dict[str, Any]) -> gym.Env:
    return load_env_creator(entry_point)(**env_kwargs)


class _CommandBackend:
    """A :class:`~progpo_envs.core.worker_protocol.VectorBackend` whose copies run commands: a reset, step
    or call is one :class:`~progpo_envs.core.worker_protocol.Reset`/``Step``/``Call`` per copy for
    :meth:`_run`."""

    num_envs: int

    def _run(self, commands: Sequence[EnvCommand], copies: Sequence[int] | None) -> list[Any]:
        """``commands[k]`` on copy ``copies[k]`` (``None``: one command per copy, in order); the results."""
        raise NotImplementedError

    def reset(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        copies: Sequence[int] | None = None,
    ) -> list[ResetResult]:
        return self._run([Reset(seed, opts) for seed, opts in zip(seeds, options, strict=True)], copies)

    def step(self, actions: Sequence[Any], copies: Sequence[int] | None = None) -> list[StepResult]:
        return self._run([Step(action) for action in actions], copies)

    def call(self, name: str, args: tuple = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        return self._run([Call(name, args, kwargs or {})] * self.num_envs, None)


class _SyncBackend(_CommandBackend):
    """All copies in this process."""

    def __init__(self, entry_point: str, env_kwargs: dict[str, Any], num_envs: int):
        self.num_envs = num_envs
        self.envs = [_make_env(entry_point, env_kwargs) for _ in range(num_envs)]

    def _run(self, commands: Sequence[EnvCommand], copies: Sequence[int] | None) -> list[Any]:
        envs = self.envs if copies is None else [self.envs[i] for i in copies]
        return [apply_command(env, command) for env, command in zip(envs, commands, strict=True)]

    def close(self) -> None:
        for env in self.envs:
            env.close()


@dataclasses.dataclass(frozen=True)
class _ShardRun:
    """A message to a shard's worker: ``commands[k]`` for its copy ``copies[k]`` (local indices; ``None``:
    one command per copy of the shard, in order)."""

    commands: list[EnvCommand]
    copies: list[int] | None = None


def _worker(
    conn, entry_point: str, env_kwargs: dict[str, Any], num_envs: int, environ: dict[str, str]
) -> None:
    """Subprocess loop: build a shard of copies, then answer :class:`_ShardRun` messages with a
    :class:`~progpo_envs.core.worker_protocol.Reply` (the results, or the traceback) until
    :class:`~progpo_envs.core.worker_protocol.Shutdown`."""
    # A forkserver child inherits the environment of the moment the forkserver started; use the parent's
    # current one instead, so variables set later (ALFWORLD_DATA, PROGPO_CACHE, ...) reach every worker.
    os.environ.clear()
    os.environ.update(environ)
    try:
        envs = [_make_env(entry_point, env_kwargs) for _ in range(num_envs)]
        conn.send(Reply.success())
    except Exception:  # report construction errors to the parent instead of dying silently
        conn.send(Reply.failure(traceback.format_exc()))
        conn.close()
        return

    def handle(message: Any) -> Reply:
        if not isinstance(message, _ShardRun):
            return Reply.failure(f"unknown worker message {message!r}: a vector env worker runs a _ShardRun")
        try:
            targets = envs if message.copies is None else [envs[i] for i in message.copies]
            return Reply.success(
                [apply_command(env, command) for env, command in zip(targets, message.commands, strict=True)]
            )
        except Exception:
            return Reply.failure(traceback.format_exc())

    if serve_requests(conn, handle):
        for env in envs:
            env.close()
        conn.send(Reply.success())
    conn.close()


class _AsyncBackend(_CommandBackend):
    """Copies split into contiguous shards, one subprocess per shard."""

    def __init__(
        self,
        entry_point: str,
        env_kwargs: dict[str, Any],
        num_envs: int,
        num_workers: int,
        mp_context: str | None,
    ):
        ctx = mp.get_context(
            mp_context or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        )
        self.num_envs = num_envs
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self.shards = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        self.conns, self.processes = [], []
        for start, stop in self.shards:
            parent, child = ctx.Pipe()
            worker_args = (child, entry_point, env_kwargs, stop - start, dict(os.environ))
            process = ctx.Process(target=_worker, args=worker_args, daemon=True)
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        self._gather()

    def _gather(self, shards: Sequence[int] | None = None) -> list[Any]:
        results, errors = [], []
        for shard in range(len(self.conns)) if shards is None else shards:
            conn = self.conns[shard]
            try:
                reply: Reply = conn.recv()
            except (EOFError, ConnectionError, OSError) as exc:
                raise RuntimeError(
                    f"vector env worker {shard} died ({exc!r}); close and rebuild the vector env"
                ) from exc
            if reply.ok:
                results.append(reply.value)
            else:
                errors.append(f"worker {shard}:\n{reply.error}")
        if errors:
            raise RuntimeError("error in vector env worker(s):\n" + "\n".join(errors))
        return results

    def _run(self, commands: Sequence[EnvCommand], copies: Sequence[int] | None) -> list[Any]:
        """One message to each shard that holds some of the copies, the shards stepping in parallel."""
        if copies is None:
            if len(commands) != self.num_envs:
                raise ValueError(f"expected one command per copy ({self.num_envs}), got {len(commands)}")
            for (start, stop), conn in zip(self.shards, self.conns, strict=True):
                conn.send(_ShardRun(list(commands[start:stop])))
            return [item for shard in self._gather() for item in shard]
        by_shard: dict[int, tuple[list[int], list[int], list[EnvCommand]]] = {}
        for position, (i, command) in enumerate(zip(copies, commands, strict=True)):
            shard = next(k for k, (start, stop) in enumerate(self.shards) if start <= i < stop)
            where, local, shard_commands = by_shard.setdefault(shard, ([], [], []))
            where.append(position)
            local.append(i - self.shards[shard][0])
            shard_commands.append(command)
        order = sorted(by_shard)
        for shard in order:
            _, local, shard_commands = by_shard[shard]
            self.conns[shard].send(_ShardRun(shard_commands, local))
        results: list[Any] = [None] * len(commands)
        for shard, payload in zip(order, self._gather(order), strict=True):
            for position, result in zip(by_shard[shard][0], payload, strict=True):
                results[position] = result
        return results

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(Shutdown())
                conn.recv()
            except (EOFError, BrokenPipeError, ConnectionError, OSError):
                pass
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


class GroupVectorEnv(VectorEnv):
    """``num_envs = B·G`` copies of a text env in ``B`` groups of ``group_size`` (see the module docstring).

    Args:
        entry_point: ``"module:Class"`` of the single env.
        num_envs: Total copies; a multiple of ``group_size``.
        group_size: Copies per task group (``G``).
        vector_mode: ``"sync"`` (in-process) or ``"async"`` (subprocesses).
        num_workers: Subprocesses for ``"async"`` (default: CPU cores, at most ``num_envs``).
        mp_context: Multiprocessing start method for ``"async"`` (default forkserver where available).
        **env_kwargs: Passed to every copy.

    Attributes:
        backend: Where the copies run (:meth:`make_backend`).
    """

    metadata = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        entry_point: str,
        num_envs: int,
        group_size: int = 1,
        vector_mode: VectorMode | str = VectorMode.SYNC,
        num_workers: int | None = None,
        mp_context: str | None = None,
        **env_kwargs: Any,
    ):
        if group_size < 1 or num_envs < 1 or num_envs % group_size:
            raise ValueError(
                f"num_envs ({num_envs}) must be a positive multiple of group_size ({group_size})"
            )
        self.num_envs = int(num_envs)
        self.group_size = int(group_size)
        self.num_groups = self.num_envs // self.group_size
        self.vector_mode = VectorMode(vector_mode)
        self.backend = self.make_backend(entry_point, env_kwargs, num_workers, mp_context)
        self.single_observation_space = self.backend.call("observation_space")[0]
        self.single_action_space = self.backend.call("action_space")[0]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.group_ids = np.arange(self.num_envs) // self.group_size
        self._group_id_values = self.group_ids.tolist()  # as plain ints, the type every info's group_id has
        # The generator of seedless resets, built on first use from the last reset seed (None: fresh entropy):
        # building one costs more than stepping a fast env, and most runs only ever reset with a seed.
        self._group_seeds: np.random.Generator | None = None
        self._group_seeds_seed: int | None = None
        self.closed = False

    def make_backend(
        self, entry_point: str, env_kwargs: dict[str, Any], num_workers: int | None, mp_context: str | None
    ) -> VectorBackend:
        """Where the ``num_envs`` copies run, for :attr:`vector_mode`: all in this process (``"sync"``) or in
        shards over ``num_workers`` subprocesses (``"async"``). A subclass returns its own backend here (the
        remote env's batched requests)."""
        if self.vector_mode is VectorMode.SYNC:
            return _SyncBackend(entry_point, env_kwargs, self.num_envs)
        workers = min(self.num_envs, num_workers or os.cpu_count() or 1)
        return _AsyncBackend(entry_point, env_kwargs, self.num_envs, workers, mp_context)

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict]:
        """Reset every copy; all copies of a group get the same seed and task (see the module docstring)."""
        observations, copy_infos = self._reset_all(seed, options)
        return observations, self.batch_infos(copy_infos)

    def reset_copies(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """:meth:`reset`, with ``info`` as one plain dict per copy (each with its ``group_id``).

        Each dict is what :func:`~progpo_envs.core.vector_info.unbatch_info` makes of :meth:`reset`'s info,
        without batching the copies' infos first.
        """
        observations, copy_infos = self._reset_all(seed, options)
        return observations, unbatch_copy_infos(copy_infos, self.batch_infos)

    def _reset_all(
        self, seed: int | Sequence[int] | None, options: dict[str, Any] | None
    ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """Reset every copy; the copies' own infos, each with its ``group_id``."""
        options = dict(options or {})
        task_indices = options.pop("task_indices", None)
        if task_indices is not None and len(task_indices) != self.num_groups:
            raise ValueError(
                f"task_indices needs one task per group ({self.num_groups}), got {len(task_indices)}"
            )
        if isinstance(seed, Sequence):  # Gymnasium's list form: one seed per group
            if len(seed) != self.num_groups:
                raise ValueError(f"seed needs one seed per group ({self.num_groups}), got {len(seed)}")
            group_seeds = [int(s) for s in seed]
            self._group_seeds, self._group_seeds_seed = None, group_seeds[0]
        elif seed is not None:
            self._group_seeds, self._group_seeds_seed = None, seed
            group_seeds = [seed + b for b in range(self.num_groups)]
        else:
            if self._group_seeds is None:
                self._group_seeds = np.random.default_rng(self._group_seeds_seed)
            group_seeds = [int(s) for s in self._group_seeds.integers(0, 2**31 - 1, self.num_groups)]
        seeds, per_env_options = [], []
        for i in range(self.num_envs):
            b = i // self.group_size
            env_options = dict(options)
            if task_indices is not None:
                env_options["task_index"] = int(task_indices[b])
            seeds.append(group_seeds[b])
            per_env_options.append(env_options)
        results = self.backend.reset(seeds, per_env_options)
        observations = tuple(obs for obs, _ in results)
        return observations, self._tag_groups([info for _, info in results])

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every copy; copies whose episode ended return their final observation again."""
        *results, copy_infos = self._step_all(actions)
        return (*results, self.batch_infos(copy_infos))

    def step_copies(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """:meth:`step`, with ``info`` as one plain dict per copy (each with its ``group_id``).

        Each dict is what :func:`~progpo_envs.core.vector_info.unbatch_info` makes of :meth:`step`'s info.
        Batching costs more than a step of a fast in-process env; a caller that wants per-copy infos (the
        agent harness, a training loop) saves that and the unbatching.
        """
        *results, copy_infos = self._step_all(actions)
        return (*results, unbatch_copy_infos(copy_infos, self.batch_infos))

    def reset_group(
        self, group: int, *, seed: int, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """Reset the copies of group ``group`` alone (seed ``seed``, ``options["task_index"]`` its task), the
        others playing on: a new group starts in the slots of one whose episodes all ended. Their
        observations and plain infos (each with its ``group_id``), in copy order.
        """
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group must be in 0..{self.num_groups - 1}, got {group}")
        copies = range(group * self.group_size, (group + 1) * self.group_size)
        results = self.backend.reset(
            [int(seed)] * len(copies), [dict(options or {})] * len(copies), copies=list(copies)
        )
        infos = [{**info, "group_id": group} for _, info in results]
        return tuple(obs for obs, _ in results), infos

    def step_some(
        self, copies: Sequence[int], actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step only the copies ``copies`` (with ``actions[k]`` for copy ``copies[k]``), the others waiting on
        their agent: :meth:`step_copies` for a subset, results in the order of ``copies``. Under ``"async"``
        the shards holding them step in parallel."""
        if len(actions) != len(copies):
            raise ValueError(f"{len(copies)} copies need as many actions, got {len(actions)}")
        if len(set(copies)) != len(copies) or not all(0 <= i < self.num_envs for i in copies):
            raise ValueError(f"copies must be distinct indices in 0..{self.num_envs - 1}, got {list(copies)}")
        results = self.backend.step(list(actions), copies=list(copies))
        return (
            tuple(r[0] for r in results),
            np.array([r[1] for r in results], dtype=np.float64),
            np.array([r[2] for r in results], dtype=bool),
            np.array([r[3] for r in results], dtype=bool),
            [{**r[4], "group_id": self._group_id_values[i]} for r, i in zip(results, copies, strict=True)],
        )

    def _step_all(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step every copy; the copies' own infos, each with its ``group_id``."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        results = self.backend.step(list(actions))
        observations = tuple(r[0] for r in results)
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminations = np.array([r[2] for r in results], dtype=bool)
        truncations = np.array([r[3] for r in results], dtype=bool)
        return observations, rewards, terminations, truncations, self._tag_groups([r[4] for r in results])

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every copy (or read attribute ``name``); one result per copy."""
        return tuple(self.backend.call(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every copy."""
        return self.call(name)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the ``"async"`` workers, one per shard (none in ``"sync"`` mode)."""
        if isinstance(self.backend, _AsyncBackend):
            return tuple(int(process.pid) for process in self.backend.processes)
        return ()

    def close_extras(self, **kwargs: Any) -> None:
        """Close every copy and stop the workers."""
        self.backend.close()

    def batch_infos(self, copy_infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Gymnasium's vector ``info`` (dict of arrays with ``_key`` masks) from the copies' own infos.

        The same as folding Gymnasium's ``VectorEnv._add_info`` over the copies, built a key at a time.
        """
        try:
            return _batch_infos(copy_infos, self.num_envs)
        except _IrregularInfos:  # shapes _batch_infos leaves to Gymnasium: fold its _add_info over the copies
            merged: dict[str, Any] = {}
            for i, info in enumerate(copy_infos):
                merged = self._add_info(merged, info, i)
            return merged

    def _tag_groups(self, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each copy's info with its ``group_id`` added."""
        return [
            {**info, "group_id": group_id}
            for info, group_id in zip(infos, self._group_id_values, strict=True)
        ]


class _IrregularInfos(Exception):
    """Per-copy infos whose keys do not batch cleanly (see :func:`_batch_infos`)."""


#: Value types whose column gets their own dtype in ``VectorEnv._add_info`` (besides numpy scalars).
_SCALAR_TYPES = (int, float, bool)


def _batch_entries(
    indices: Sequence[int], infos: Sequence[dict[str, Any]], num_envs: int, all_present: np.ndarray
) -> dict[str, Any]:
    """Batch ``infos[n]`` (the info of copy ``indices[n]``); ``all_present``: an all-True mask to copy."""
    # key -> ([copy index, ...], [value, ...]), keys in order of first appearance (as _add_info inserts them)
    columns: dict[Any, tuple[list[int], list[Any]]] = {}
    for n, info in enumerate(infos):  # (zip(strict=True) costs more than this loop body for one copy)
        i = indices[n]
        for key, value in info.items():
            column = columns.get(key)
            if column is None:
                columns[key] = ([i], [value])
            else:
                column[0].append(i)
                column[1].append(value)
    batched: dict[str, Any] = {}
    for key, (where, values) in columns.items():
        mask_key = f"_{key}"
        # a key named like another key's mask, or two keys with one mask name (1 and "1"): in _add_info they
        # overwrite each other
        if mask_key in columns or mask_key in batched:
            raise _IrregularInfos(key)
        if len(where) == num_envs:  # in every copy, so where == [0, 1, ..., num_envs - 1]
            mask = all_present.copy()
        else:
            mask = np.zeros(num_envs, dtype=np.bool_)
            mask[where] = True
        first = values[0]
        kind = type(first)
        if key == "final_obs":  # kept as objects, whatever they are
            array: Any = np.empty(num_envs, dtype=object)  # all None, like _add_info's np.full(.., None)
        elif kind is dict or isinstance(first, dict):  # nested infos batch recursively, like _add_info
            if not all(isinstance(value, dict) for value in values):
                raise _IrregularInfos(key)
            batched[key], batched[mask_key] = _batch_entries(where, values, num_envs, all_present), mask
            continue
        elif kind in _SCALAR_TYPES or issubclass(kind, np.number):  # _add_info's dtype: the first value's
            array = np.zeros(num_envs, dtype=kind)
        elif isinstance(first, np.ndarray):
            array = np.zeros((num_envs, *first.shape), dtype=first.dtype)
        else:
            array = np.empty(num_envs, dtype=object)
        for n, value in enumerate(values):
            if isinstance(value, dict):
                raise _IrregularInfos(key)
            array[where[n]] = value  # numpy's own casting, exactly as _add_info assigns
        batched[key], batched[mask_key] = array, mask
    return batched


def _batch_infos(infos: Sequence[dict[str, Any]], num_envs: int) -> dict[str, Any]:
    """Gymnasium's vector ``info`` (dict of arrays with ``_key`` masks) from one info per copy, key by key.

    The result equals folding :meth:`gymnasium.vector.VectorEnv._add_info` over the copies in order (same keys
    in the same order, same dtypes: a column's dtype comes from its first value; same masks; nested dicts
    batched recursively; ``final_obs`` an object array), without its per-copy, per-key dict and mask updates.

    Raises:
        _IrregularInfos: For shapes whose result ``_add_info`` defines only by accident (a key that is a dict
            in one copy and a plain value in another, or a key named like another key's ``_`` mask); the
            caller then folds ``_add_info`` itself.

    Example:
        >>> _batch_infos([{"won": True, "hint": "look"}, {"won": False}], 2)["_hint"].tolist()
        [True, False]
    """
    all_present = np.zeros(num_envs, dtype=np.bool_)
    all_present.fill(True)  # (np.ones is a Python function, several times slower for a few copies)
    return _batch_entries(list(range(num_envs)), infos, num_envs, all_present)


def reset_per_copy(
    envs: VectorEnv, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """``envs.reset`` with one plain info dict per copy, for any vector env.

    A :class:`GroupVectorEnv` hands its copies' infos out without batching them
    (:meth:`GroupVectorEnv.reset_copies`); any other vector env's batched info is taken apart with
    :func:`~progpo_envs.core.vector_info.unbatch_info`. Both give the same dicts.
    """
    if isinstance(envs, GroupVectorEnv):
        return envs.reset_copies(seed=seed, options=options)
    observations, info = envs.reset(seed=seed, options=options)
    return observations, unbatch_info(info, envs.num_envs)


def step_per_copy(envs: VectorEnv, actions: Any) -> tuple[Any, Any, Any, Any, list[dict[str, Any]]]:
    """``envs.step`` with one plain info dict per copy, for any vector env (see :func:`reset_per_copy`)."""
    if isinstance(envs, GroupVectorEnv):
        return envs.step_copies(actions)
    *results, info = envs.step(actions)
    return (*results, unbatch_info(info, envs.num_envs))


def make_group_vector_env(entry_point: str, num_envs: int = 1, **kwargs: Any) -> GroupVectorEnv:
    """The ``vector_entry_point`` of every registered text env (bound to its ``entry_point`` with
    ``partial``)."""
    return GroupVectorEnv(entry_point, num_envs=num_envs, **kwargs)
