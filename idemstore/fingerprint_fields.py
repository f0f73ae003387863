"""Which fields of a JSON document a fingerprint covers: ``fingerprint_include`` and
``fingerprint_exclude``, written as JSON pointers (RFC 6901).

One selection serves every door: the HTTP middlewares (ASGI, WSGI, Django) apply it to a JSON
request body, the ``@idempotent`` decorators (async and sync) to the call's arguments as an
object of argument name to value. A pointer is ``/`` followed by reference tokens separated
by ``/``, with ``~1`` for a ``/`` and ``~0`` for a ``~`` inside a key (``/meta/sent_at``,
``/items/0/price``, ``/a~1b`` for the key ``a/b``).

- ``exclude``: the fingerprint covers the document without those members (JSON Patch
  ``remove``: a removed array element shifts the ones after it). A pointer that leads
  nowhere in a document removes nothing.
- ``include``: the fingerprint covers only what those pointers lead to, each by its pointer;
  a pointer that leads nowhere counts as absent, which differs from any value (``null`` too).

Both at once are refused: which one wins for a field under both would be a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from idemstore.errors import ConfigurationError

__all__ = ["FieldSelection", "field_selection", "parse_pointer", "readable_again"]

# RFC 6901: an array index is 0 or digits without a leading zero.
_INDEX = re.compile(r"0|[1-9][0-9]*")
# Inside a token, "~" only starts "~0" or "~1".
_BAD_ESCAPE = re.compile(r"~(?![01])")

Tokens = tuple[str, ...]


def parse_pointer(option: str, pointer: object) -> Tokens:
    """The reference tokens of ``pointer``, or ``ConfigurationError`` naming ``option``."""
    if not isinstance(pointer, str):
        raise ConfigurationError(
            f"{option}: {pointer!r} is not a JSON pointer; write one as a string such as"
            ' "/meta/sent_at"'
        )
    if not pointer:
        raise ConfigurationError(
            f'{option}: "" points at the whole document; name a field, such as "/trace_id"'
        )
    if not pointer.startswith("/"):
        raise ConfigurationError(
            f"{option}: {pointer!r} is not a JSON pointer (RFC 6901): start it with /, as"
            f" {'/' + pointer.replace('~', '~0').replace('.', '/')!r}"
        )
    if _BAD_ESCAPE.search(pointer):
        raise ConfigurationError(
            f"{option}: {pointer!r} has a ~ that is not ~0 (a ~) or ~1 (a /); write a ~ in"
            " a key as ~0"
        )
    # ~1 before ~0: "~01" is the key "~1", not "/".
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def _pointers(option: str, value: object) -> dict[str, Tokens]:
    if value is None:
        return {}
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f'{option} must be a list of JSON pointers such as ["/meta/sent_at"], not {value!r}'
        )
    pointers = {str(p): parse_pointer(option, p) for p in value}
    if not pointers:
        raise ConfigurationError(
            f"{option} is an empty list; leave it out (None) to cover every field"
        )
    return pointers


def readable_again(value: Any) -> Any:
    """``value`` as a tuple when it is a one-pass iterable (a generator), else as given: a door
    that builds its middleware or decorator again after a fork reads its options twice."""
    if isinstance(value, Iterator):
        return tuple(value)
    return value


class FieldSelection:
    """A checked ``include`` or ``exclude`` list; ``apply`` gives what a fingerprint covers."""

    __slots__ = ("exclude", "include")

    def __init__(self, include: dict[str, Tokens], exclude: dict[str, Tokens]) -> None:
        self.include = include
        self.exclude = exclude

    def first_tokens(self) -> set[str]:
        """The first token of every pointer (the decorator checks them against arguments)."""
        return {tokens[0] for tokens in (*self.include.values(), *self.exclude.values())}

    def apply(self, document: Any) -> Any:
        """What the fingerprint covers of ``document``; ``document`` itself is not changed."""
        if self.include:
            return {
                "include": {
                    pointer: _found(document, tokens) for pointer, tokens in self.include.items()
                }
            }
        for tokens in self.exclude.values():
            document = _without(document, tokens)
        return document


def field_selection(include: object, exclude: object) -> FieldSelection | None:
    """The selection ``include``/``exclude`` give (``None``: the whole document), checked."""
    included = _pointers("fingerprint_include", include)
    excluded = _pointers("fingerprint_exclude", exclude)
    if included and excluded:
        raise ConfigurationError(
            "give fingerprint_include or fingerprint_exclude, not both: list the fields the"
            " fingerprint covers, or the ones it leaves out"
        )
    if not included and not excluded:
        return None
    return FieldSelection(included, excluded)


def _child(value: Any, token: str) -> tuple[bool, Any]:
    if isinstance(value, dict):
        return (token in value), value.get(token)
    if isinstance(value, (list, tuple)) and _INDEX.fullmatch(token) and int(token) < len(value):
        return True, value[int(token)]
    return False, None


def _found(document: Any, tokens: Tokens) -> list[Any]:
    """``[value]`` at ``tokens``, or ``[]`` when there is none (so absent differs from null)."""
    value = document
    for token in tokens:
        present, value = _child(value, token)
        if not present:
            return []
    return [value]


def _without(value: Any, tokens: Tokens) -> Any:
    """``value`` without the member at ``tokens``: copied along the path, shared elsewhere."""
    token, rest = tokens[0], tokens[1:]
    present, child = _child(value, token)
    if not present:
        return value
    if isinstance(value, dict):
        copy = dict(value)
        if rest:
            copy[token] = _without(child, rest)
        else:
            del copy[token]
        return copy
    items = list(value)
    if rest:
        items[int(token)] = _without(child, rest)
    else:
        del items[int(token)]
    return items
