"""Who is calling: the one rule every consumer uses to tell callers apart.

An idempotency record must only ever be matched by a request from the caller that created it
(SEP-3182: records are scoped to "whatever authorization boundary already governs access").
Every consumer (the ASGI middleware, the MCP server adapters, the MCP gateway, the stdio
proxy) decides that boundary here, the same way:

- **Which parts of a request are the boundary**: ``CallerSources``, a list of sources such as
  ``header:authorization``, ``cookie:*`` (every cookie), ``cookie:session``, ``query:*`` (every
  query parameter), ``query:api_key``, or a header a front proxy sets from a client certificate
  (``header:x-client-cert``). The default for MCP endpoints is ``DEFAULT_SOURCES``: the
  ``Authorization`` header, the cookies and the query string; for HTTP APIs
  ``HTTP_API_SOURCES`` leaves the query string out (it is request data there).
- **How they are normalized**, so that one caller is one caller: runs of spaces and tabs are
  one space and the ends are trimmed; in ``Authorization`` and ``Proxy-Authorization`` the
  scheme is case-insensitive (``Bearer alice``, ``bearer alice`` and ``Bearer  alice`` are one
  caller); cookies and query parameters are compared as sorted (name, value) pairs, after
  percent-decoding. Credentials themselves stay case-sensitive.
- **How they are fitted into a scope**: ``caller_scope(namespace, caller)``; only a SHA-256 of
  the credentials is ever kept (the raw token never reaches the store, a log line or a span),
  and a scope too long for a store, or one holding NUL or a lone surrogate, is replaced by its
  SHA-256 (``fit_scope``).

A request that carries none of the sources has no identity (``None``): a consumer never puts
such a request in a record another caller can match. What it does instead is the consumer's
documented choice (the ASGI middleware answers 400; the gateway relays the call without
deduplication, or refuses it, or, when the operator says so, uses one shared scope).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl

from idemstore.errors import ConfigurationError
from idemstore.hashing import fingerprint
from idemstore.records import MAX_SCOPE_LENGTH

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_SOURCES",
    "HTTP_API_SOURCES",
    "CallerSources",
    "Source",
    "asgi_headers",
    "caller_scope",
    "fit_scope",
    "normalize_field",
]

DEFAULT_SOURCES = ("header:authorization", "cookie:*", "query:*")
"""The request parts that name the caller of an MCP endpoint unless configured otherwise
(the gateway, the MCP server adapters): an MCP POST carries its data in the body, so its query
string can only be credentials (``?api_key=``)."""

HTTP_API_SOURCES = ("header:authorization", "cookie:*")
"""The default for the HTTP middleware: an API request's query string is data (part of its
fingerprint), not who is calling."""

SourceKind = Literal["header", "cookie", "query"]

_KINDS: tuple[SourceKind, ...] = ("header", "cookie", "query")
# Header fields whose first token is an authentication scheme (RFC 9110 11.1: case-insensitive).
_SCHEMED = frozenset({"authorization", "proxy-authorization"})
_WHITESPACE = re.compile(r"[ \t]+")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True, slots=True)
class Source:
    """One part of a request that names its caller: a header, a cookie or a query parameter.

    ``name`` is ``"*"`` for every cookie or every query parameter; header names are
    case-insensitive (kept lower case), cookie and parameter names are not.
    """

    kind: SourceKind
    name: str

    @classmethod
    def parse(cls, text: str) -> Source:
        """``KIND:NAME``, e.g. ``header:authorization``, ``cookie:*``, ``query:api_key``."""
        kind, colon, name = text.strip().partition(":")
        kind = kind.strip().lower()
        name = name.strip()
        if not colon or kind not in _KINDS or not name:
            raise ConfigurationError(
                f"a caller source is header:NAME, cookie:NAME, cookie:*, query:NAME or query:*,"
                f" not {text!r}"
            )
        if kind == "header":
            if name == "*" or _TOKEN.fullmatch(name) is None:
                raise ConfigurationError(f"{text!r} does not name one header field")
            name = name.lower()
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def normalize_field(name: str, value: str) -> str:
    """One header value as the caller rule compares it (see the module docstring)."""
    text = _WHITESPACE.sub(" ", value).strip(" ")
    if name in _SCHEMED:
        scheme, space, rest = text.partition(" ")
        text = scheme.lower() + space + rest
    return text


def _cookies(values: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        for item in value.split(";"):
            name, equals, content = item.partition("=")
            name = name.strip(" \t")
            if name and equals:
                pairs.append((name, content.strip(" \t")))
    return pairs


class CallerSources:
    """The parts of a request that form its caller's authorization boundary.

    Args:
        sources: ``Source`` values or their text (``header:NAME``, ``cookie:NAME``,
            ``cookie:*``, ``query:NAME``, ``query:*``); default ``DEFAULT_SOURCES``.
    """

    __slots__ = ("_headers", "sources")

    def __init__(self, sources: Iterable[str | Source] = DEFAULT_SOURCES) -> None:
        parsed = tuple(s if isinstance(s, Source) else Source.parse(s) for s in sources)
        if not parsed:
            raise ConfigurationError("name at least one caller source, e.g. header:authorization")
        self.sources = tuple(dict.fromkeys(parsed))  # in order, once each
        self._headers = frozenset(s.name for s in self.sources if s.kind == "header")

    def __repr__(self) -> str:
        return f"CallerSources({', '.join(map(str, self.sources))})"

    def caller(self, headers: Iterable[tuple[str, str]], query: str = "") -> str | None:
        """The caller of a request: a SHA-256 of its normalized sources, or ``None``.

        ``headers`` are (lower-case name, value) pairs in order; ``query`` is the raw query
        string. ``None`` when none of the sources is present (an anonymous request).
        """
        fields: dict[str, list[str]] = {}
        cookies: list[str] = []
        for name, value in headers:
            if name in self._headers:
                fields.setdefault(name, []).append(normalize_field(name, value))
            if name == "cookie":
                cookies.append(value)
        parts: list[Any] = []
        for source in self.sources:
            found = self._values(source, fields, cookies, query)
            if found:
                parts.append([str(source), found])
        if not parts:
            return None
        return fingerprint(parts)

    @staticmethod
    def _values(
        source: Source, fields: Mapping[str, list[str]], cookies: list[str], query: str
    ) -> list[Any]:
        if source.kind == "header":
            return [value for value in fields.get(source.name, ()) if value]
        if source.kind == "cookie":
            pairs = _cookies(cookies) if cookies else []
        else:
            pairs = parse_qsl(query, keep_blank_values=True) if query else []
        if source.name == "*":
            return sorted([name, value] for name, value in pairs)
        return sorted(value for name, value in pairs if name == source.name)


def asgi_headers(scope: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An ASGI scope's headers as (lower-case name, value) text pairs, in order."""
    return [
        (name.decode("latin-1").lower(), value.decode("latin-1"))
        for name, value in scope.get("headers", ())
    ]


def fit_scope(scope: str) -> str:
    """``scope`` as every store accepts it: too long, or holding NUL or a lone surrogate,
    it is replaced by its SHA-256 (one boundary still names one scope)."""
    if len(scope) <= MAX_SCOPE_LENGTH and "\x00" not in scope:
        try:
            scope.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return scope
    return "sha256:" + hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()


def caller_scope(namespace: str, caller: str) -> str:
    """The record scope of ``caller`` within ``namespace`` (a consumer, an upstream)."""
    return fit_scope(f"{namespace}/{caller}")
