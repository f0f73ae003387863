"""Who is calling: the one rule every door uses to tell callers apart.

An idempotency record must only ever be matched by a request from the caller that created it
(records are scoped to "whatever authorization boundary already governs access"). Every door
(HTTP middleware, the MCP gateway and server adapters, the consumers) answers that question
here, the same way, in this order:

1. **A principal, when the application or the door has verified one**: ASGI
   ``scope["user"].identity``, Django's ``request.user``, ``REMOTE_USER`` when configured, a
   verified JWT's subject, or whatever a ``caller=`` callable returns. A ``Principal`` has a
   *realm* (the kind of identity: a Django user pk is not a ``REMOTE_USER`` string) and a
   subject; nothing else about the request counts, so a refreshed token or a changed analytics
   cookie of the same principal is the same caller. A user object without a usable identity is
   no principal, never a guess from its display name.
2. **Else named credentials** (``CallerSources``): by default only what is a credential by
   definition, ``Authorization`` and ``Proxy-Authorization``; a cookie, a query parameter or
   another header counts only when the operator names it (``cookie:session``,
   ``query:api_key``, ``header:x-api-key``). "Every cookie" is not an identity (browsers change
   analytics cookies on every page view), so ``cookie:*`` and ``query:*`` are refused. A source
   that is present but identifies nobody (a scheme with no credential such as a bare
   ``Bearer``, an empty value, ``undefined``, ``null``) is absent. Only a SHA-256 of the
   normalized credentials is kept: the raw token never reaches the store, a log line or a span.
   In this mode a refreshed token is a new caller: ``describe_caller_rule`` says so once at
   startup.
3. **Else nobody can tell** (``None``): a door never puts such a request in a record another
   caller can match. What it does instead is its documented choice (HTTP answers 400; the
   gateway relays the call without deduplication or refuses it), never a shared scope unless
   the operator opted in.

Normalization, so that one caller is one caller: runs of spaces and tabs are one space and the
ends are trimmed; in ``Authorization`` and ``Proxy-Authorization`` the scheme is
case-insensitive (``Bearer alice``, ``bearer alice`` and ``Bearer  alice`` are one caller);
credentials themselves stay case-sensitive. ``caller_scope(namespace, caller)`` fits the result
into a record scope (too long, or holding NUL or a lone surrogate: its SHA-256, ``fit_scope``).
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
    "APP_REALM",
    "DEFAULT_SOURCES",
    "CallerSources",
    "Principal",
    "Source",
    "asgi_headers",
    "caller_scope",
    "caller_sources_of",
    "describe_caller_rule",
    "fit_scope",
    "normalize_field",
    "principal_of",
    "scope_of_caller",
]

DEFAULT_SOURCES = ("header:authorization", "header:proxy-authorization")
"""The request parts that name a caller without a principal unless the operator names others:
only the fields that are credentials by definition (RFC 9110 11.6)."""

APP_REALM = "app"
"""The realm of a string a door's ``caller=`` callable returns."""

SourceKind = Literal["header", "cookie", "query"]

_KINDS: tuple[SourceKind, ...] = ("header", "cookie", "query")
# Header fields whose first token is an authentication scheme (RFC 9110 11.1: case-insensitive).
_SCHEMED = frozenset({"authorization", "proxy-authorization"})
_WHITESPACE = re.compile(r"[ \t]+")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REALM = re.compile(r"[a-z0-9][a-z0-9.\-]*")
# Values clients send when the credential they meant to send was missing: they name nobody, so
# two strangers sending them must never be one caller.
_NOBODY = frozenset({"", "undefined", "null", "none", "nil", '""', "''"})


@dataclass(frozen=True, slots=True)
class Principal:
    """A caller the application or the door has verified: who, not which bytes they sent.

    ``realm`` is the kind of identity (``user`` for an ASGI ``scope["user"]``, ``django-user``,
    ``remote-user``, ``jwt``, ``app`` for a ``caller=`` callable): one subject in two realms is
    two callers. ``subject`` is the identity within the realm (a user id, ``issuer|sub``).
    """

    realm: str
    subject: str

    def __post_init__(self) -> None:
        if _REALM.fullmatch(self.realm) is None:
            raise ConfigurationError(
                f"a principal's realm is lower-case letters, digits, '.' and '-':"
                f" not {self.realm!r}"
            )

    @classmethod
    def of(cls, realm: str, subject: object) -> Principal | None:
        """The principal ``subject`` names in ``realm``, or ``None`` when it names nobody (not a
        string or number, empty, or only spaces)."""
        if isinstance(subject, bool) or not isinstance(subject, (str, int)):
            return None
        text = str(subject).strip()
        return cls(realm, text) if text else None

    def __str__(self) -> str:
        return f"principal:{self.realm}:{self.subject}"


@dataclass(frozen=True, slots=True)
class Source:
    """One part of a request that carries a credential: a header, a cookie or a query
    parameter, each named (header names are case-insensitive, kept lower case)."""

    kind: SourceKind
    name: str

    @classmethod
    def parse(cls, text: str) -> Source:
        """``KIND:NAME``, e.g. ``header:authorization``, ``cookie:session``, ``query:api_key``."""
        kind, colon, name = text.strip().partition(":")
        kind = kind.strip().lower()
        name = name.strip()
        if not colon or kind not in _KINDS or not name:
            raise ConfigurationError(
                f"a caller source is header:NAME, cookie:NAME or query:NAME, not {text!r}"
            )
        if name == "*":
            raise ConfigurationError(
                f"{text!r} would make every {kind} part of who is calling, so a changed analytics"
                f" cookie or page parameter would split one caller; name the one that carries"
                f" the credential, e.g. {kind}:{'session' if kind == 'cookie' else 'api_key'}"
            )
        if kind == "header":
            if _TOKEN.fullmatch(name) is None:
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


def _names_somebody(name: str | None, value: str) -> bool:
    """False for a value that is present but identifies nobody (module docstring)."""
    if name in _SCHEMED:
        _, _, value = value.partition(" ")  # the scheme alone names nobody
    return value.strip(" ").lower() not in _NOBODY


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
    """The named credentials that tell callers apart when no principal does.

    Args:
        sources: ``Source`` values or their text (``header:NAME``, ``cookie:NAME``,
            ``query:NAME``); default ``DEFAULT_SOURCES``.
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

    def __str__(self) -> str:
        return " ".join(map(str, self.sources))

    def caller(self, headers: Iterable[tuple[str, str]], query: str = "") -> str | None:
        """The caller of a request: a SHA-256 of its normalized credentials, or ``None``.

        ``headers`` are (lower-case name, value) pairs in order; ``query`` is the raw query
        string. ``None`` when no source is present with a value that names somebody.
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
    ) -> list[str]:
        if source.kind == "header":
            values = fields.get(source.name, [])
        elif source.kind == "cookie":
            values = [v for n, v in _cookies(cookies) if n == source.name] if cookies else []
        else:
            pairs = parse_qsl(query, keep_blank_values=True) if query else []
            values = [v for n, v in pairs if n == source.name]
        name = source.name if source.kind == "header" else None
        return sorted(v for v in values if _names_somebody(name, v))


def principal_of(returned: object) -> Principal | None:
    """What a ``caller=`` callable returned, as a principal: a ``Principal`` as it is, a
    string as the subject of realm ``app``, ``None`` (or a string naming nobody) as none."""
    if returned is None or isinstance(returned, Principal):
        return returned
    if isinstance(returned, str):
        return Principal.of(APP_REALM, returned)
    raise TypeError(
        f"the caller callable returned {type(returned).__name__}; return a Principal, a str or None"
    )


def caller_sources_of(sources: Iterable[str] | CallerSources | None) -> CallerSources | None:
    """The ``caller_sources`` option: names (``header:NAME``, ``cookie:NAME``,
    ``query:NAME``), a ``CallerSources``, or ``None`` for none."""
    if sources is None or isinstance(sources, CallerSources):
        return sources
    if isinstance(sources, str):
        raise ConfigurationError(
            f"caller_sources must be a list of sources such as ['cookie:session'], not {sources!r}"
        )
    return CallerSources(sources)


def scope_of_caller(
    namespace: str,
    principal: Principal | None,
    sources: CallerSources | None,
    headers: Iterable[tuple[str, str]] = (),
    query: str = "",
) -> str | None:
    """The record scope of a request within ``namespace`` by the rule above: its principal,
    else its named credentials (``sources``; ``None`` reads none), else ``None``."""
    if principal is not None:
        return caller_scope(namespace, str(principal))
    if sources is None:
        return None
    caller = sources.caller(headers, query)
    return None if caller is None else caller_scope(namespace, f"credential-sha256:{caller}")


def describe_caller_rule(principal: str | None, sources: CallerSources | None) -> str:
    """One line for a door's startup log: how it tells callers apart, and, when credentials
    can decide, that a refreshed credential is then a new caller."""
    parts = [f"callers by {principal}"] if principal else []
    if sources is not None:
        parts.append(
            f"{'else ' if principal else 'callers '}by the bytes of {sources}"
            " (a refreshed credential is a new caller: verify a principal to keep one)"
        )
    return ", ".join(parts) if parts else "no caller rule: every keyed request is refused"


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
    """The record scope of ``caller`` within ``namespace`` (a door, an upstream)."""
    return fit_scope(f"{namespace}/{caller}")
