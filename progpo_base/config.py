"""Dataclass configs: self-documenting fields, a YAML mapping in, dotted ``section.key=value`` overrides.

A config is a dataclass whose fields carry their documentation (:func:`documented_field`, or
:func:`required_field` for a key without a default) and whose sections are dataclass fields themselves.
:func:`from_mapping` builds one from nested plain values, checking each against its field's annotation,
choices and :class:`Bounds` (the range of a numeric key: ``optim.lr=-1`` is refused, naming the key, before
anything is built); an unknown key is an error that lists the valid ones. :func:`parse_override` reads
``optim.lr=1e-5`` (the value as YAML), :func:`read_yaml_mapping` a config file, :func:`describe_fields` lists
every key with its default and meaning (a command's ``--help-config``), and :func:`add_aliases` gives a
command short flags for the keys people set most (``--episodes 20`` for ``episodes=20``), each flag's help
generated from its field. ``progpo train`` and ``progpo eval`` read their command lines with these, so both
behave alike.

Example:
    >>> @dataclasses.dataclass
    ... class Serve:
    ...     port: int = documented_field(8000, "port to listen on")
    ...     mode: str = documented_field("sync", "sync | async", choices=("sync", "async"))
    >>> data = {}
    >>> set_dotted(data, *parse_override("port=9000"))
    >>> from_mapping(Serve, data)
    Serve(port=9000, mode='sync')
    >>> from_mapping(Serve, {"mode": "asink"})
    Traceback (most recent call last):
    progpo_base.config.ConfigError: mode 'asink' is not one of sync, async (did you mean 'async'?)
    >>> describe_fields(Serve)
    [('port', '8000', 'port to listen on'), ('mode', "'sync'", 'sync | async')]
    >>> @dataclasses.dataclass
    ... class Optim:
    ...     lr: float = documented_field(3e-4, "learning rate", bounds=above(0))
    >>> from_mapping(Optim, {"lr": -1})
    Traceback (most recent call last):
    progpo_base.config.ConfigError: lr must be > 0, got -1.0
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from progpo_base.usage import suggestion


class ConfigError(ValueError):
    """A configuration file or override is malformed or names an unknown key; ``key`` is the dotted key it is
    about, when there is one."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a numeric key takes: ``low`` to ``high`` (``None``: no bound on that side), each end
    included unless ``low_open``/``high_open``; a float must also be finite. A list key's bounds hold for each
    of its items (``optim.betas``). Made by :func:`at_least`, :func:`above` and :func:`between`.

    Example:
        >>> str(at_least(1)), str(above(0)), str(between(0, 1, low_open=True))
        ('>= 1', '> 0', 'in (0, 1]')
        >>> between(0, 1, high_open=True).holds(1.0), above(0).holds(float("nan")), at_least(0).holds(3)
        (False, False, True)
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is in the range (NaN and infinities never are)."""
        if not math.isfinite(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {opening}{self.low:g}, {self.high:g}{closing}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'<' if self.high_open else '<='} {self.high:g}"


def at_least(low: float) -> Bounds:
    """``>= low``."""
    return Bounds(low=low)


def above(low: float) -> Bounds:
    """``> low``."""
    return Bounds(low=low, low_open=True)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Bounds:
    """``low`` to ``high``, each end included unless it is open."""
    return Bounds(low=low, high=high, low_open=low_open, high_open=high_open)


def documented_field(
    default: Any, doc: str, choices: Sequence[str] | None = None, bounds: Bounds | None = None
) -> Any:
    """A dataclass field carrying its documentation (shown by ``--help-config``), for a key that takes one
    of a few names its ``choices`` (checked by :func:`from_mapping`, offered by its flag), and for a numeric
    key its ``bounds`` (checked by :func:`from_mapping`)."""
    metadata = {"doc": doc, "choices": tuple(choices) if choices is not None else None, "bounds": bounds}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def enum_field(default: enum.Enum, doc: str) -> Any:
    """A documented field taking one of the values of ``default``'s enum (its ``choices``)."""
    return documented_field(default.value, doc, choices=[member.value for member in type(default)])


def required_field(doc: str, choices: Sequence[str] | None = None) -> Any:
    """A documented dataclass field without a default: a config that does not set it is an error."""
    return dataclasses.field(
        metadata={"doc": doc, "choices": tuple(choices) if choices is not None else None}
    )


def section(cls: type, doc: str) -> Any:
    """A dataclass field holding a section (another config dataclass, its defaults when not set)."""
    return dataclasses.field(default_factory=cls, metadata={"doc": doc})


def _is_required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _optional_of(annotation: Any) -> Any:
    """``X`` for an annotation ``X | None`` (or ``Optional[X]``), else ``None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and len(typing.get_args(annotation)) == 2:
            return members[0]
    return None


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a field's annotation (ints are accepted where floats are expected)."""
    optional = _optional_of(annotation)
    if optional is not None:
        return None if value is None else _coerce(value, optional, key)
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}", key)
        return from_mapping(annotation, value, prefix=key + ".")
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}", key)
    if annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key} must be an integer, got {value!r}", key)
    if annotation is float and not isinstance(value, float):
        raise ConfigError(f"{key} must be a number, got {value!r}", key)
    if annotation is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}", key)
    if (annotation is list or origin is list) and not isinstance(value, list):
        raise ConfigError(f"{key} must be a list, got {value!r}", key)
    if (annotation is dict or origin is dict) and not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping, got {value!r}", key)
    return value


def from_mapping(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """An instance of the config dataclass ``cls`` from nested plain values (unset keys keep their defaults).

    Raises :class:`ConfigError` for an unknown key (naming the valid ones), a missing required key, a value of
    the wrong type, or a value outside its field's choices.
    """
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"unknown key {prefix + unknown[0]!r}; valid keys here: {', '.join(prefix + n for n in names)}",
            prefix + unknown[0],
        )
    values = {}
    for field in fields:
        key = prefix + field.name
        if field.name not in data:
            if _is_required(field):
                raise ConfigError(f"{key} is required: {field.metadata.get('doc', '')}", key)
            continue
        value = data[field.name]
        default = _default(field)
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            value = {**dataclasses.asdict(default), **value}
        value = _coerce(value, hints[field.name], key)
        choices = field.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise ConfigError(
                f"{key} {value!r} is not one of {', '.join(choices)}{suggestion(str(value), choices)}", key
            )
        _check_bounds(value, field.metadata.get("bounds"), key)
        values[field.name] = value
    return cls(**values)


def _check_bounds(value: Any, bounds: Bounds | None, key: str) -> None:
    """``value`` (a number, or each item of a list) within ``bounds``, else a :class:`ConfigError` naming
    ``key``."""
    if bounds is None or value is None:
        return
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            raise ConfigError(f"{key} must hold numbers {bounds}, got {value!r}", key)
        if not bounds.holds(item):
            what = f"each item of {key}" if isinstance(value, list) else key
            raise ConfigError(f"{what} must be {bounds}, got {value!r}", key)


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted = "a.b.c"``, making the sections on the way."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is not a section", dotted)
    node[parts[-1]] = value


def get_dotted(data: Mapping, dotted: str, default: Any) -> Any:
    """``data[a][b][c]`` for ``dotted = "a.b.c"``, or ``default`` when a part is missing."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def parse_override(text: str) -> tuple[str, Any]:
    """``"optim.lr=1e-5"`` -> ``("optim.lr", 1e-05)``; values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. rollout.group_size=8)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse the value of {key!r}: {exc}", key.strip()) from exc
    if isinstance(value, str) and _looks_like_float(value):  # YAML 1.1 reads "1e-5" as a string
        value = float(value)
    return key.strip(), value


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return any(c in text.lower() for c in ".e") and text.lower() not in ("inf", "nan", "-inf", "+inf")


def _yaml_floats(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _yaml_floats(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_yaml_floats(v) for v in node]
    if isinstance(node, str) and _looks_like_float(node):
        return float(node)
    return node


def read_yaml_mapping(path: str | Path) -> dict:
    """The nested mapping of a YAML config file (``1e-5`` read as a number, as in :func:`parse_override`)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return _yaml_floats(loaded)


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted key, default, doc)`` for every leaf field (for ``--help-config``); ``required`` for a key
    without a default; the doc of a key with :class:`Bounds` ends with them (``[> 0]``)."""
    rows = []
    for field in dataclasses.fields(cls):
        if _is_required(field):
            rows.append((prefix + field.name, "required", field.metadata.get("doc", "")))
            continue
        value = _default(field)
        if dataclasses.is_dataclass(value):
            rows += describe_fields(type(value), prefix + field.name + ".")
        else:
            doc, bounds = field.metadata.get("doc", ""), field.metadata.get("bounds")
            rows.append((prefix + field.name, repr(value), f"{doc} [{bounds}]" if bounds else doc))
    return rows


def field_table(cls: type) -> list[str]:
    """The lines of ``--help-config``: each key, its default and its meaning."""
    return [f"{key:<36} {default:<24} {doc}" for key, default, doc in describe_fields(cls)]


def find_field(cls: type, dotted: str) -> tuple[dataclasses.Field, Any]:
    """The field a dotted key names and its resolved annotation."""
    *sections, name = dotted.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if field is None:
        raise ConfigError(f"{cls.__name__} has no key {name!r}", dotted)
    return field, typing.get_type_hints(cls)[name]


#: ``dest`` of the (key, value) pairs the alias flags collect, in command-line order.
ALIASED = "aliased_values"


class _SetKeys(argparse.Action):
    """A short flag for one or more config keys: ``--episodes 20`` collects ``("episodes", 20)``; a mapping
    key (``env_kwargs.*``) takes ``KEY=VALUE`` and collects ``("env_kwargs.KEY", VALUE)``."""

    def __init__(self, option_strings, dest, keys: tuple[str, ...], **kwargs):
        self.keys = keys
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        pairs = list(getattr(namespace, self.dest, None) or [])
        for key in self.keys:
            if key.endswith(".*"):
                try:
                    name, value = parse_override(values)
                except ConfigError as error:
                    raise argparse.ArgumentError(self, f"expected KEY=VALUE, got {values!r}") from error
                pairs.append((f"{key[:-2]}.{name}", value))
            else:
                pairs.append((key, values))
        setattr(namespace, self.dest, pairs)


def _flag_type(annotation: Any) -> Any:
    annotation = _optional_of(annotation) or annotation
    return annotation if annotation in (int, float, str) else None


def _spellings(aliases: Mapping[Any, Any]):
    for flags, keys in aliases.items():
        yield (
            ((flags,) if isinstance(flags, str) else tuple(flags)),
            ((keys,) if isinstance(keys, str) else tuple(keys)),
        )


def alias_flags(aliases: Mapping[Any, Any]) -> dict[str, str]:
    """Each key's flag in ``aliases`` (see :func:`add_aliases`; its first spelling), for messages about a key.

    Example:
        >>> alias_flags({("--num-envs", "--batch"): "num_envs", "--model": ("openai.model", "hf.path")})
        {'num_envs': '--num-envs', 'openai.model': '--model', 'hf.path': '--model'}
    """
    return {key: flags[0] for flags, keys in _spellings(aliases) for key in keys}


def add_aliases(parser: argparse.ArgumentParser, cls: type, aliases: Mapping[Any, Any]) -> None:
    """Add a short flag per entry of ``aliases``: a flag (or a tuple of its spellings) -> a dotted key of
    ``cls`` (or a tuple of keys it sets together; ``section.*`` for a mapping field's items, given as
    ``KEY=VALUE``). Each flag's type and choices are its field's, its help the field's doc with the key and
    the default; the parsed pairs land in ``namespace.aliased_values`` (:data:`ALIASED`) in command-line
    order."""
    for flags, keys in _spellings(aliases):
        if keys[0].endswith(".*"):
            field, _ = find_field(cls, keys[0][:-2])
            parser.add_argument(
                *flags,
                action=_SetKeys,
                keys=keys,
                dest=ALIASED,
                metavar="KEY=VALUE",
                help=_escape(
                    f"{field.metadata['doc']}: one item of {keys[0][:-2]} (VALUE read as YAML); repeatable"
                ),
            )
            continue
        found = [find_field(cls, key) for key in keys]
        docs = list(dict.fromkeys(field.metadata.get("doc", "") for field, _ in found))
        defaults = {repr(_default(field)) for field, _ in found if not _is_required(field)}
        shown = "; ".join(docs)
        where = ", ".join(keys)
        if len(defaults) == 1 and (default := _default(found[0][0])) not in (None, "", [], {}):
            shown += f" (= {where}; default: {default})"
        else:
            shown += f" (= {where})"
        field, annotation = found[0]
        choices = field.metadata.get("choices")
        parser.add_argument(
            *flags,
            action=_SetKeys,
            keys=keys,
            dest=ALIASED,
            type=_flag_type(annotation),
            choices=choices,
            metavar=None if choices else flags[0].lstrip("-").upper().replace("-", "_"),
            help=_escape(shown),
        )


def _escape(text: str) -> str:
    """``%`` doubled: argparse formats help strings with ``%``."""
    return text.replace("%", "%%")
