"""A store's options, each declared once: name, type, default, check and a line of doc.

A backend declares one ``Options`` table beside its store class. From it come:

- the constructor's argument checks: ``OPTIONS.check(locals())`` as the constructor's first
  statement validates every option and returns the values to keep (durations as floats,
  choices lower-cased);
- ``from_url``: ``OPTIONS.from_url(parsed)`` converts the query parameters and keyword options
  of a ``StoreURL`` to the option types, refuses unknown ones (listing the known ones) and
  returns the keyword arguments for the constructor (only the options given: the signature's
  defaults apply to the rest);
- the options table of the backend's docs page: ``OPTIONS.markdown()``, which
  ``tests/test_store_options.py`` compares with the page between
  ``<!-- store-options: module:NAME -->`` and ``<!-- /store-options -->``;
- the CLI help, ``idemstore options ENGINE``: ``OPTIONS.text()``, the same rows as plain text.

The constructor keeps its typed keyword signature (mypy and IDEs read it); the same test
checks that the signature and the table agree on every name and default.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.backends.urls import pop_bool, pop_float, pop_int, pop_str
from idemstore.errors import ConfigurationError

if TYPE_CHECKING:
    from idemstore.backends.urls import StoreURL

__all__ = ["Check", "Option", "Options", "at_least", "check_clock", "one_of"]

Check = Callable[[str, Any], Any]
"""``check(name, value)``: the value to keep, or ``ConfigurationError`` naming the option."""

# How a URL's text (or a keyword given to open_store) becomes each kind; ``object`` options
# (a clock, a session) pass through as given.
_PARSERS: dict[type, Callable[[dict[str, Any], str, Any], Any]] = {
    str: pop_str,
    int: pop_int,
    float: pop_float,
    bool: pop_bool,
}
_KIND_PHRASES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_KIND_NAMES = {str: "str", int: "int", float: "float", bool: "bool", object: "object"}
# Markdown emphasis and code marks, which a terminal would show as noise.
_MARKUP = re.compile(r"`|\*\*")


def _is_kind(value: object, kind: type) -> bool:
    if kind is object:
        return True
    if kind is float:  # an int is a number of seconds too, a bool is not
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@dataclass(frozen=True, slots=True)
class Option:
    """One constructor option. ``default`` None makes the option optional (an empty query
    parameter means None); ``url=False`` marks a keyword-only one (a clock, a session), left
    out of the docs table; ``shown_default`` replaces the default's rendering there."""

    name: str
    kind: type
    default: Any
    doc: str
    check: Check | None = None
    url: bool = True
    shown_default: str | None = None

    def checked(self, value: object) -> Any:
        """The value to keep, once its type and check pass."""
        if value is None and self.default is None:
            return None
        if not _is_kind(value, self.kind):
            raise ConfigurationError(
                f"{self.name} must be {_KIND_PHRASES[self.kind]}, not {value!r}"
            )
        return value if self.check is None else self.check(self.name, value)

    def parsed(self, options: dict[str, Any]) -> Any:
        """Pop this option from a URL's options, converted to its kind."""
        if self.kind is object:
            return options.pop(self.name)
        if self.default is None and options.get(self.name) in (None, ""):
            options.pop(self.name)
            return None
        return _PARSERS[self.kind](options, self.name, self.default)

    def shown(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer():
            text = str(int(value))
        else:
            text = "none" if value is None else str(value)
        return f"`{text}`"


class Options:
    """A store's table of options, in the order its docs list them."""

    __slots__ = ("_options",)

    def __init__(self, *options: Option) -> None:
        names = [option.name for option in options]
        if len(set(names)) != len(names):
            raise ValueError(f"an option is declared twice: {names}")
        self._options = {option.name: option for option in options}

    def __iter__(self) -> Iterator[Option]:
        return iter(self._options.values())

    def names(self) -> list[str]:
        return list(self._options)

    def check(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's checked value, read from ``given`` (a constructor's ``locals()``)."""
        return {name: option.checked(given[name]) for name, option in self._options.items()}

    def from_url(self, parsed: StoreURL, *, also_known: Collection[str] = ()) -> dict[str, Any]:
        """The keyword arguments a URL's options give the constructor. Every option left in
        ``parsed.options`` must be one of the table's; ``also_known`` are names the store
        consumed before (named in the refusal, so the list of known options is whole)."""
        found = {
            name: option.parsed(parsed.options)
            for name, option in self._options.items()
            if name in parsed.options
        }
        if parsed.options:
            unknown = ", ".join(sorted(parsed.options))
            known = ", ".join(sorted({*self._options, *also_known}))
            raise ConfigurationError(
                f"unknown option(s) for {parsed.scheme}:// stores: {unknown}; known: {known}"
            )
        return found

    def markdown(self) -> str:
        """The docs table of the options a URL may carry."""
        rows = ["| option | default | meaning |", "|---|---|---|"]
        rows += [f"| `{o.name}` | {o.shown()} | {o.doc} |" for o in self if o.url]
        return "\n".join(rows) + "\n"

    def text(self, width: int = 80) -> str:
        """The options a URL may carry as plain text no wider than ``width``: a line of name,
        type and default per option, its doc wrapped below it; then the keyword-only ones."""
        shown = [o for o in self if o.url]
        name_width = max([len("option")] + [len(o.name) for o in shown])
        head = f"{{:<{name_width}}}  {{:<5}}  "
        lines = [head.format("option", "type") + "default"]
        for option in shown:
            first = head.format(option.name, _KIND_NAMES[option.kind])
            default = textwrap.wrap(
                _MARKUP.sub("", option.shown()), max(width - len(first), 20)
            ) or [""]
            lines.append(first + default[0])
            lines += [" " * len(first) + more for more in default[1:]]
            lines += textwrap.wrap(
                _MARKUP.sub("", option.doc),
                width,
                initial_indent="    ",
                subsequent_indent="    ",
            )
        keywords = [o.name for o in self if not o.url]
        if keywords:
            lines += ["", *textwrap.wrap(f"As keywords only: {', '.join(keywords)}", width)]
        return "\n".join(lines) + "\n"


# -- checks the tables share ----------------------------------------------------------------


def at_least(minimum: int) -> Check:
    """A number of at least ``minimum``."""

    def check(name: str, value: Any) -> Any:
        if not value >= minimum:  # also refuses NaN
            raise ConfigurationError(f"{name} must be at least {minimum}, not {value!r}")
        return value

    return check


def one_of(*choices: str) -> Check:
    """One of ``choices``, in any case; kept lower-cased."""

    def check(name: str, value: Any) -> str:
        chosen = str(value).lower()
        if chosen not in choices:
            raise ConfigurationError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return chosen

    return check


def check_clock(name: str, value: Any) -> Any:
    """A time source: a callable returning epoch seconds."""
    if not callable(value):
        raise ConfigurationError(f"{name} must be a callable returning epoch seconds: {value!r}")
    return value
