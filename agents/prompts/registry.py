"""The prompt styles by name: an open registry an env's ``metadata["prompt_style"]`` names a style in.

The package registers ``alfworld``, ``webshop`` and the generic ``text`` style (:data:`DEFAULT_STYLE`, for an
env that names none). A new env with prompts of its own registers its style once, in the module that defines
it (imported before the env is played, e.g. the env's own module when it may import ``agents``)::

    register_style(EnvPromptStyle(name="guess", role="You are playing a guessing game.", ...))

Example:
    >>> import agents.prompts
    >>> "alfworld" in style_names() and get_style("webshop").name
    'webshop'
    >>> get_style("alfwrold")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: unknown prompt style 'alfwrold' (did you mean 'alfworld'?); registered: ...
"""

from __future__ import annotations

import difflib

from agents.prompts.style import EnvPromptStyle

#: The style of an env whose metadata names none.
DEFAULT_STYLE = "text"
#: The Gymnasium metadata key an env names its prompt style under.
METADATA_KEY = "prompt_style"

_STYLES: dict[str, EnvPromptStyle] = {}


def register_style(style: EnvPromptStyle) -> EnvPromptStyle:
    """Register ``style`` under ``style.name`` (again with the same style: a no-op); returns it.

    Raises:
        ValueError: When another style holds the name.
    """
    held = _STYLES.get(style.name)
    if held is not None and held != style:
        raise ValueError(f"a different prompt style is registered as {style.name!r} already")
    _STYLES[style.name] = style
    return style


def style_names() -> list[str]:
    """The registered style names, sorted."""
    return sorted(_STYLES)


def get_style(name: str) -> EnvPromptStyle:
    """The style registered as ``name`` (a :class:`ValueError` naming the registered ones otherwise)."""
    style = _STYLES.get(str(name))
    if style is None:
        close = difflib.get_close_matches(str(name), _STYLES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown prompt style {name!r}{hint}; registered: {', '.join(style_names())}")
    return style


def style_name_from_metadata(metadata: object) -> str:
    """The style an env's Gymnasium ``metadata`` names, else :data:`DEFAULT_STYLE`; checked to be registered.

    Example:
        >>> style_name_from_metadata({"render_modes": ["ansi"], "prompt_style": "alfworld"})
        'alfworld'
        >>> style_name_from_metadata({"render_modes": ["ansi"]})
        'text'
    """
    name = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    name = DEFAULT_STYLE if name is None else str(name)
    get_style(name)
    return name
