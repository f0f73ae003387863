"""Store URLs: ``open_store(url)`` picks the backend by scheme and imports its driver lazily."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from idemstore import telemetry
from idemstore.backends.registry import (
    engine_for_scheme,
    known_schemes,
    load_target,
    register_backend,
    scheme_of,
)
from idemstore.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "StoreURL",
    "known_schemes",
    "malformed_url_error",
    "open_store",
    "parse_store_url",
    "pop_bool",
    "pop_float",
    "pop_int",
    "pop_str",
    "redact_url",
    "register_backend",
    "require_driver",
]

N = TypeVar("N", int, float)


# "user:secret@" where urlsplit sees no password: a malformed URL ("redis:/u:pw@h", one slash)
# or a password with a '/', '?' or '#' that was not percent-encoded ("redis://u:pa/ss@h").
# Everything from the ':' after the user to the last '@' is hidden.
_SCHEME_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:/*")
_LOOSE_CREDENTIALS = re.compile(r"([^:@/?#]*):.*@", re.DOTALL)
# Not a URL at all (no "scheme:"): hide from the first ':' to the last '@'.
_NO_SCHEME_CREDENTIALS = re.compile(r"([^:]*):.*@", re.DOTALL)


def _hide_loose_password(url: str) -> str:
    prefix = _SCHEME_PREFIX.match(url)
    if prefix is None:
        found = _NO_SCHEME_CREDENTIALS.match(url)
    else:
        found = _LOOSE_CREDENTIALS.match(url, prefix.end())
        if found is None and not prefix.group().endswith("/"):
            found = _LOOSE_CREDENTIALS.match(url)  # "user:secret@host": no scheme at all
    if found is None:
        return url
    return f"{url[: found.start()]}{found.group(1)}:***@{url[found.end() :]}"


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``, for logs and error messages.

    Errs on the side of hiding: in a URL whose path or query holds an '@' after a 'host:port',
    the part in between is hidden too.
    """
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return _hide_loose_password(url)
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
    except ValueError:
        return "<unparseable URL>"


def malformed_url_error(url: str, exc: ValueError) -> ConfigurationError:
    """The error for a URL ``urlsplit`` refused with ``exc``, without ``exc``'s own text when
    that quotes the host part or the port (either may be the password)."""
    reason = str(exc)
    if "netloc" in reason:
        reason = "its user, password or host has characters that normalize to / ? # @ or :"
    elif "Port" in reason:
        # A password with an unencoded '/' ends the host part early and is read as the port.
        reason = "bad port"
    return ConfigurationError(f"malformed store URL {redact_url(url)!r}: {reason}")


def _required_scheme(url: str) -> str:
    """``url``'s scheme, read the registry's one way; a string without one is refused."""
    scheme = scheme_of(url) if isinstance(url, str) else ""
    if not scheme:
        raise ConfigurationError(
            f"{redact_url(url) if isinstance(url, str) else url!r} is not a store URL; "
            f"expected SCHEME://..., with SCHEME one of: {', '.join(known_schemes())}"
        )
    return scheme


def open_store(url: str, **options: Any) -> IdempotencyStore:
    """Build the store a URL names. Query parameters and ``options`` become engine options.

    The store connects on first use (or on ``async with``); this call does no I/O.
    """
    scheme = _required_scheme(url)
    engine = engine_for_scheme(scheme)
    if engine is None:
        raise ConfigurationError(
            f"unknown store scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    require_driver(engine.driver, engine.extra, f"the {scheme}:// backend", install=engine.install)
    try:
        cls = load_target(engine.store)
    except ModuleNotFoundError as exc:
        module = engine.store.partition(":")[0]
        if exc.name == module and module.startswith("idemstore."):
            raise ConfigurationError(
                f"the {scheme}:// backend is not part of this version of idemstore yet"
            ) from None
        raise MissingDependencyError(
            f"the {scheme}:// backend could not import {exc.name!r}: "
            + MissingDependencyError.install_line(engine.extra, engine.install)
        ) from exc
    store = cast("IdempotencyStore", cls.from_url(url, **options))
    # After idemstore.instrument() the store records spans and metrics; before, it is returned
    # as built (no wrapper, no cost).
    return telemetry.instrumented(store, backend=engine.label(scheme))


def require_driver(
    driver: str | None, extra: str | None, what: str, *, install: str | None = None
) -> None:
    """Raise ``MissingDependencyError`` saying what installs ``driver`` when it is not
    installed: ``install`` when given, else the pip extra."""
    if driver is not None and importlib.util.find_spec(driver) is None:
        raise MissingDependencyError(
            f"{what} needs the {driver!r} package: "
            + MissingDependencyError.install_line(extra, install)
        )


# -- parsing helpers backends share ----------------------------------------------------------


@dataclass(slots=True)
class StoreURL:
    """A split store URL whose options (query parameters merged with keyword options) are
    consumed with the ``pop_*`` helpers; ``reject_unknown`` then refuses any leftover."""

    scheme: str
    netloc: str
    path: str
    username: str | None
    password: str | None
    hostname: str | None
    port: int | None
    options: dict[str, Any] = field(default_factory=dict)

    def reject_unknown(self) -> None:
        if self.options:
            names = ", ".join(sorted(self.options))
            raise ConfigurationError(f"unknown option(s) for {self.scheme}:// stores: {names}")


def parse_store_url(url: str, options: dict[str, Any] | None = None) -> StoreURL:
    """Split ``url``; keyword ``options`` win over query parameters of the same name."""
    scheme = _required_scheme(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise malformed_url_error(url, exc) from None
    merged: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    merged.update(options or {})
    return StoreURL(
        scheme=scheme,
        netloc=parts.netloc,
        path=parts.path,
        username=parts.username,
        password=parts.password,
        hostname=parts.hostname,
        port=port,
        options=merged,
    )


def pop_str(options: dict[str, Any], name: str, default: str) -> str:
    value = options.pop(name, default)
    if not isinstance(value, str):
        raise ConfigurationError(f"option {name} must be a string, not {value!r}")
    return value


def pop_int(options: dict[str, Any], name: str, default: int) -> int:
    return _pop_number(options, name, default, int, "an integer")


def pop_float(options: dict[str, Any], name: str, default: float) -> float:
    return _pop_number(options, name, default, float, "a number")


def _pop_number(
    options: dict[str, Any], name: str, default: N, convert: Callable[[Any], N], what: str
) -> N:
    value = options.pop(name, default)
    try:
        if isinstance(value, bool):
            raise ValueError
        return convert(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"option {name} must be {what}, not {value!r}") from None


def pop_bool(options: dict[str, Any], name: str, default: bool) -> bool:
    value = options.pop(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"option {name} must be true or false, not {value!r}")
