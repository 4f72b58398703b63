"""Which envs a server hosts and which constructor arguments a client may choose (the allow-lists).

A client names an env id and keyword arguments; the server must never let that import arbitrary code or read
arbitrary files. So an env id is served only if the operator listed it and it is a registered ``progpo/*``
text env (its entry point is resolved from Gymnasium's registry, never from the request), and a client kwarg
is accepted only if it is in the env's allow-list with a JSON scalar (or list of scalars) value. Kwargs the
operator fixed (e.g. a data folder) cannot be overridden.

The default allow-list of an env is read from its constructor: keyword parameters whose default is a bool,
int, float, short string or a tuple of ints (``max_steps``, ``split``, ``history_depths``, ...; a ``None``
default usually stands for an object, so it is left out), excluding names that look like file-system locations
or code (``*_dir``, ``*path*``, ``*file*``, ``root``, ``*url*``, ``*module*``, ``*class*``, ``*factory*``,
``engine``) and those that build a different data set per value (``*seed``, ``num_products``,
``num_generated``: one client could otherwise make the server generate catalogs at will; clients choose tasks
through ``reset`` seeds and ``task_index`` instead). Settings that only an operator should choose are left out
too (:data:`OPERATOR_ONLY`: ``expert`` would hand the client the answer in ``info["expert_action"]``, as the
WebShop site keeps it behind ``--expose-expert``; ``max_cached_games`` sets the worker's memory); an operator
who wants clients to set them lists them in ``--allow-kwargs``.

A client's value is checked before the env sees it: its names against the allow-list *before* anything is
decoded, then each value: a JSON scalar or a short list of them, the work and memory settings within
:data:`KWARG_BOUNDS` (``history_depths`` sets the cost of every step, so a long one would let one request
hold a worker), and a ``split`` one of the env's split names (a split is a name, never a path: ALFWorld's
are the folders of its data dir, so ``"../../outside"`` or ``"/"`` would otherwise be read as one).

Example:
    >>> policy = EnvPolicy.from_registry("progpo/ALFWorld-v0")  # doctest: +SKIP
    >>> policy.resolve_kwargs({"max_steps": 10})  # doctest: +SKIP
    {'max_steps': 10}
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym

from progpo_envs.core.registration import REMOTE_ENV_ID, listed_splits
from progpo_envs.server.codec import CodecError, decode

#: Only ids in this namespace can be hosted.
HOSTABLE_NAMESPACE = "progpo/"
#: Ids that can never be hosted (a remote env served by a server would proxy to arbitrary URLs).
NEVER_HOSTED = frozenset({REMOTE_ENV_ID})
_UNSAFE_NAME = re.compile(
    r"(_dir$|^dir$|path|file|^root$|_root$|url|module|class|factory|callback|hook|engine|"
    r"seed$|^num_products$|^num_generated$)"
)
_MAX_STRING = 256
_MAX_LIST = 64
#: Constructor kwargs a client may not set unless the operator allows them by name.
OPERATOR_ONLY = frozenset({"expert", "expert_mode", "max_cached_games"})
#: Inclusive bounds of a client's integer kwargs (for a list kwarg: of each entry, and its most entries).
KWARG_BOUNDS: Mapping[str, tuple[int, int]] = {
    "max_steps": (1, 1000),
    "max_action_length": (1, 4096),
    "max_cached_games": (0, 64),
    "history_depths": (1, 64),
}
_MAX_HISTORY_DEPTHS = 8
#: What a plain split name looks like when the env's split names cannot be listed.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
#: The start of the refusal of a kwarg the client may not set (:meth:`EnvPolicy.resolve_kwargs`), which a
#: client reads back with :func:`refused_kwarg`.
_REFUSED_KWARG = re.compile(r"kwarg '(?P<name>[^']+)' is not allowed for (?P<env_id>\S+) \(allowed: ")


def refused_kwarg(message: str) -> tuple[str, str] | None:
    """``(kwarg, env id)`` when ``message`` is a server's refusal of a kwarg the client may not set (an
    operator-only one such as ``expert``, or one left out of the allow-list), else ``None``: a client can then
    say how the operator allows it.

    Example:
        >>> refused_kwarg("kwarg 'expert' is not allowed for progpo/ALFWorld-v0 (allowed: max_steps, split)")
        ('expert', 'progpo/ALFWorld-v0')
        >>> refused_kwarg("split 'x' is not one of progpo/ALFWorld-v0's splits: train") is None
        True
    """
    found = _REFUSED_KWARG.search(message)
    return None if found is None else (found["name"], found["env_id"])


class PolicyError(ValueError):
    """A request names an env or kwargs the server does not allow."""


def _default_is_simple(default: Any) -> bool:
    if isinstance(default, (bool, int, float)):
        return True
    if isinstance(default, str):
        return len(default) <= _MAX_STRING
    if isinstance(default, (tuple, list)):
        return all(isinstance(x, int) and not isinstance(x, bool) for x in default)
    return False


def default_allowed_kwargs(entry_point: str) -> frozenset[str]:
    """Keyword parameters of the env class that are safe for a client to choose (see the module docstring)."""
    module_name, _, attr = entry_point.partition(":")
    target = getattr(importlib.import_module(module_name), attr)
    allowed = set()
    for cls in target.__mro__ if inspect.isclass(target) else (target,):
        init = cls.__init__ if inspect.isclass(target) else cls
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for param in params:
            if param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD) or param.name == "self":
                continue
            if param.default is param.empty or _UNSAFE_NAME.search(param.name):
                continue
            if _default_is_simple(param.default) and param.name not in OPERATOR_ONLY:
                allowed.add(param.name)
        if not inspect.isclass(target) or cls is gym.Env:
            break
    allowed.discard("render_mode")
    return frozenset(allowed)


def _check_int(name: str, value: Any, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PolicyError(f"kwarg {name!r} must be an integer in [{low}, {high}], got {value!r}")


def _check_value(name: str, value: Any) -> Any:
    def scalar(x: Any) -> bool:
        return (
            x is None or isinstance(x, (bool, int, float)) or (isinstance(x, str) and len(x) <= _MAX_STRING)
        )

    if scalar(value):
        checked = value
    elif isinstance(value, (list, tuple)) and len(value) <= _MAX_LIST and all(scalar(x) for x in value):
        checked = value
    else:
        raise PolicyError(f"kwarg {name!r} must be a JSON scalar or a short list of scalars")
    bounds = KWARG_BOUNDS.get(name)
    if bounds is not None and isinstance(value, (list, tuple)):
        if len(value) > _MAX_HISTORY_DEPTHS:
            raise PolicyError(f"kwarg {name!r} may list at most {_MAX_HISTORY_DEPTHS} values")
        for item in value:
            _check_int(name, item, bounds)
    elif bounds is not None and value is not None:
        _check_int(name, value, bounds)
    return checked


@dataclasses.dataclass(frozen=True)
class EnvPolicy:
    """One hosted env: where it comes from, what the operator fixed, and what a client may set.

    Attributes:
        env_id: The registered id (``progpo/ALFWorld-v0``).
        entry_point: ``module:Class`` from Gymnasium's registry.
        fixed_kwargs: Kwargs set by the operator; a client cannot change them.
        allowed_kwargs: Names a client may set.
        splits: The split names a client's ``split`` must be one of (``None``: any plain name).
    """

    env_id: str
    entry_point: str
    fixed_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    allowed_kwargs: frozenset[str] = frozenset()
    splits: tuple[str, ...] | None = None

    @classmethod
    def from_registry(
        cls,
        env_id: str,
        fixed_kwargs: Mapping[str, Any] | None = None,
        allowed_kwargs: Iterable[str] | None = None,
    ) -> EnvPolicy:
        """The policy of a registered ``progpo/*`` env (default allow-list from its constructor)."""
        import progpo_envs  # noqa: F401  (registers the ids)

        if not env_id.startswith(HOSTABLE_NAMESPACE) or env_id in NEVER_HOSTED:
            raise PolicyError(f"{env_id!r} cannot be hosted: only registered {HOSTABLE_NAMESPACE}* envs can")
        if env_id not in gym.registry:
            raise PolicyError(f"{env_id!r} is not a registered env")
        spec = gym.registry[env_id]
        if not isinstance(spec.entry_point, str):
            raise PolicyError(f"{env_id!r} has no import-string entry point")
        fixed = {**(spec.kwargs or {}), **dict(fixed_kwargs or {})}
        allowed = (
            default_allowed_kwargs(spec.entry_point) if allowed_kwargs is None else frozenset(allowed_kwargs)
        )
        allowed = frozenset(allowed) - set(fixed_kwargs or {})
        splits = listed_splits(spec.entry_point, fixed) if "split" in allowed else None
        return cls(env_id, spec.entry_point, fixed, allowed, splits)

    def resolve_kwargs(self, client_kwargs: Any) -> dict[str, Any]:
        """The constructor kwargs for a client's request (:class:`PolicyError` on anything not allowed).

        ``client_kwargs`` is the request's JSON object, its values as :mod:`~progpo_envs.server.codec`
        encodes them (``{"$tuple": [1, 3]}``); a value is decoded only after every name is allowed.
        """
        if client_kwargs is None:
            client_kwargs = {}
        if not isinstance(client_kwargs, dict):
            raise PolicyError("kwargs must be a JSON object")
        # a client may restate what the operator fixed (e.g. expert=true on a server that hands out the
        # expert's actions): same value, same env; any other value is refused below like any fixed kwarg
        client_kwargs = {
            name: value
            for name, value in client_kwargs.items()
            if not (name in self.fixed_kwargs and _restates(self.fixed_kwargs[name], name, value))
        }
        for name in client_kwargs:
            if name not in self.allowed_kwargs:
                allowed = ", ".join(sorted(self.allowed_kwargs)) or "none"
                raise PolicyError(f"kwarg {name!r} is not allowed for {self.env_id} (allowed: {allowed})")
        resolved = {name: _check_value(name, _decoded(name, v)) for name, v in client_kwargs.items()}
        if "split" in resolved:
            self._check_split(resolved["split"])
        return {**self.fixed_kwargs, **resolved}

    def _check_split(self, split: Any) -> None:
        if self.splits is not None:
            if split not in self.splits:
                valid = ", ".join(self.splits) or "none"
                raise PolicyError(f"split {split!r} is not one of {self.env_id}'s splits: {valid}")
        elif not isinstance(split, str) or not _SPLIT_NAME.fullmatch(split):
            raise PolicyError(f"split must be a plain name (letters, digits, '_' and '-'), got {split!r}")


def _decoded(name: str, value: Any) -> Any:
    """A kwarg's value, decoded if it is a codec tag (a tuple of ints at most: small limits)."""
    if not isinstance(value, dict):
        return value
    try:
        return decode(value, max_depth=2, max_bytes=_MAX_LIST * 8)
    except CodecError as exc:
        raise PolicyError(f"kwarg {name!r}: {exc}") from None


def _restates(fixed: Any, name: str, value: Any) -> bool:
    """Whether a client's encoded ``value`` for ``name`` equals the operator's fixed value (same type too)."""
    try:
        decoded = _decoded(name, value)
    except PolicyError:
        return False
    return type(decoded) is type(fixed) and decoded == fixed
