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
through ``reset`` seeds and ``task_index`` instead).

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

#: Only ids in this namespace can be hosted.
HOSTABLE_NAMESPACE = "progpo/"
#: Ids that can never be hosted (a remote env served by a server would proxy to arbitrary URLs).
NEVER_HOSTED = frozenset({"progpo/Remote-v0"})
_UNSAFE_NAME = re.compile(
    r"(_dir$|^dir$|path|file|^root$|_root$|url|module|class|factory|callback|hook|engine|"
    r"seed$|^num_products$|^num_generated$)"
)
_MAX_STRING = 256
_MAX_LIST = 64


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
            if _default_is_simple(param.default):
                allowed.add(param.name)
        if not inspect.isclass(target) or cls is gym.Env:
            break
    allowed.discard("render_mode")
    return frozenset(allowed)


def _check_value(name: str, value: Any) -> Any:
    def scalar(x: Any) -> bool:
        return (
            x is None or isinstance(x, (bool, int, float)) or (isinstance(x, str) and len(x) <= _MAX_STRING)
        )

    if scalar(value):
        return value
    if isinstance(value, (list, tuple)) and len(value) <= _MAX_LIST and all(scalar(x) for x in value):
        return value
    raise PolicyError(f"kwarg {name!r} must be a JSON scalar or a short list of scalars")


@dataclasses.dataclass(frozen=True)
class EnvPolicy:
    """One hosted env: where it comes from, what the operator fixed, and what a client may set.

    Attributes:
        env_id: The registered id (``progpo/ALFWorld-v0``).
        entry_point: ``module:Class`` from Gymnasium's registry.
        fixed_kwargs: Kwargs set by the operator; a client cannot change them.
        allowed_kwargs: Names a client may set.
    """

    env_id: str
    entry_point: str
    fixed_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    allowed_kwargs: frozenset[str] = frozenset()

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
        return cls(env_id, spec.entry_point, fixed, frozenset(allowed) - set(fixed_kwargs or {}))

    def resolve_kwargs(self, client_kwargs: Any) -> dict[str, Any]:
        """The constructor kwargs for a client's request (:class:`PolicyError` on anything not allowed)."""
        if client_kwargs is None:
            client_kwargs = {}
        if not isinstance(client_kwargs, dict):
            raise PolicyError("kwargs must be a JSON object")
        for name in client_kwargs:
            if name not in self.allowed_kwargs:
                allowed = ", ".join(sorted(self.allowed_kwargs)) or "none"
                raise PolicyError(f"kwarg {name!r} is not allowed for {self.env_id} (allowed: {allowed})")
        return {**self.fixed_kwargs, **{k: _check_value(k, v) for k, v in client_kwargs.items()}}
