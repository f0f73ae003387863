"""The ASGI middleware's options, checked when it is built: a mistake fails at start-up with a
message that says what to pass, not with a 500 on the first keyed request."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from idemstore.backends.urls import open_store
from idemstore.errors import ConfigurationError
from idemstore.protocol import IdempotencyStore

if TYPE_CHECKING:
    from idemstore.callers import CallerSources
    from idemstore.execution import TakeoverPolicy
    from idemstore.http.outcome_rule import UnrecordedPolicy
    from idemstore.http.wire import RoutePredicate, Scope

__all__ = [
    "KeyedRequestOptions",
    "check_app",
    "check_size",
    "header_names",
    "method_set",
    "required_predicate",
    "store_of",
]

HEADER_NAME = "idempotency-key"

# RFC 9110's token: what a method name may be made of.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class KeyedRequestOptions(TypedDict, total=False):
    """The middleware's options for a keyed request, declared once for the doors that forward
    them to it (``idemstore.http.wsgi``); ``IdempotencyMiddleware`` holds their defaults and
    meaning, and checks them."""

    caller_sources: Iterable[str] | CallerSources | None
    retention: float
    lease_ttl: float
    max_body_bytes: int
    max_response_bytes: int
    record_server_errors: bool
    on_unrecorded: UnrecordedPolicy
    max_key_length: int
    on_takeover: TakeoverPolicy
    fingerprint_exclude: Iterable[str] | None
    fingerprint_include: Iterable[str] | None
    fingerprint_headers: Iterable[str] | None


def check_app(app: object) -> None:
    if not callable(app):
        raise TypeError(f"app must be an ASGI app (an async callable), not {app!r}")


def store_of(store: object) -> tuple[IdempotencyStore, bool]:
    """The store to use, and whether the middleware owns it (opened it from a URL)."""
    if isinstance(store, str):
        # No I/O: the store connects on first use. Its URL is checked now.
        return open_store(store), True
    if not isinstance(store, IdempotencyStore):
        raise TypeError(
            "store must be an IdempotencyStore (such as open_store('postgresql://...')) or a"
            f" store URL string, not {type(store).__name__}"
        )
    return store, False


def method_set(methods: object) -> frozenset[str]:
    """The upper-cased method names ``methods`` gives (one name, or several)."""
    names: Iterable[object]
    if isinstance(methods, str):
        names = (methods,)
    elif isinstance(methods, Iterable):
        names = tuple(methods)
    else:
        raise TypeError(f"methods must be method names such as ('POST', 'PATCH'), not {methods!r}")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"methods must be strings such as 'POST', not {name!r}")
        if not _TOKEN.fullmatch(name):
            raise ConfigurationError(f"methods: {name!r} is not an HTTP method name")
    if not names:
        raise ConfigurationError(
            "methods must name at least one method (such as ('POST', 'PATCH')); without any"
            " the middleware would do nothing"
        )
    return frozenset(str(name).upper() for name in names)


def required_predicate(required: object) -> RoutePredicate:
    """Whether a request needs a key: ``True``/``False``, path patterns, or a predicate."""
    if isinstance(required, bool):
        flag = required
        return lambda _scope: flag
    if callable(required):
        return required
    if isinstance(required, str):
        required = (required,)
    if not isinstance(required, Iterable):
        raise TypeError(
            "required must be True, False, path patterns such as ['/orders/*'], or a predicate"
            f" given the ASGI scope, not {required!r}"
        )
    patterns = tuple(required)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(
                f"required: path patterns must be strings such as '/orders/*', not {pattern!r}"
            )
    return lambda scope: _matches(scope, patterns)


def _matches(scope: Scope, patterns: tuple[str, ...]) -> bool:
    path = scope.get("path", "")
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def check_size(name: str, value: object, *, least: int = 0) -> int:
    """A number of bytes (or characters): an int, not a bool, of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a non-negative int" if least == 0 else f"an int of at least {least}"
        raise ConfigurationError(f"{name} must be {what}, not {value!r}")
    return value


def header_names(headers: object, *, option: str = "fingerprint_headers") -> tuple[bytes, ...]:
    """The lower-cased field names ``headers`` gives, for the fingerprint to cover."""
    if headers is None:
        return ()
    if isinstance(headers, str) or not isinstance(headers, Iterable):
        raise ConfigurationError(
            f'{option} must be a list of header names such as ["X-Tenant"], not {headers!r}'
        )
    names: list[bytes] = []
    for name in headers:
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ConfigurationError(f"{option}: {name!r} is not an HTTP header name")
        if name.lower() == HEADER_NAME:
            raise ConfigurationError(
                f"{option}: {name!r} is the key itself; records are already kept per key"
            )
        names.append(name.lower().encode("ascii"))
    # Sorted and without repeats: the same names in another order are the same fingerprint.
    return tuple(sorted(set(names)))
