"""Small pure rules every backend applies alike: what a valid key is, how tokens are made."""

from __future__ import annotations

import enum
import math
import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError, InvalidKeyError

if TYPE_CHECKING:
    from idemstore.protocol import Record

__all__ = [
    "MAX_DURATION",
    "MAX_FINGERPRINT_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_SCOPE_LENGTH",
    "RecordQuery",
    "RecordState",
    "check_duration",
    "check_fingerprint",
    "check_identity",
    "check_key",
    "check_limit",
    "check_response",
    "check_timeout",
    "lease_owns_nothing",
    "new_token",
]

MAX_KEY_LENGTH = 255
MAX_SCOPE_LENGTH = 1024
MAX_FINGERPRINT_LENGTH = 128
MAX_DURATION = 100 * 365.25 * 86400.0


def _check_text(what: str, value: object, max_length: int, *, allow_empty: bool) -> str:
    if not isinstance(value, str):
        raise InvalidKeyError(f"{what} must be a str, not {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidKeyError(f"{what} must not be empty")
    if len(value) > max_length:
        raise InvalidKeyError(f"{what} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise InvalidKeyError(f"{what} must not contain NUL characters")
    if value.isascii():  # the usual key, known to encode without making the bytes
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates cannot be stored by any engine (UTF-8 columns, JSON, Redis keys alike).
        raise InvalidKeyError(
            f"{what} contains a lone surrogate, which is not valid Unicode"
        ) from None
    return value


# "No fingerprint to check" (get, delete, wait): a sentinel, because None given to reserve is a
# bad fingerprint that must be refused like any other non-str.
_NO_FINGERPRINT: Any = object()


def check_identity(
    key: object,
    scope: object,
    fingerprint: object = _NO_FINGERPRINT,
    *,
    max_key_length: int = MAX_KEY_LENGTH,
) -> None:
    """Raise ``InvalidKeyError`` unless key, scope (and fingerprint, when given) are valid."""
    _check_text("key", key, max_key_length, allow_empty=False)
    _check_text("scope", scope, MAX_SCOPE_LENGTH, allow_empty=True)
    if fingerprint is not _NO_FINGERPRINT:
        check_fingerprint(fingerprint)


def check_key(key: object, *, max_key_length: int = MAX_KEY_LENGTH) -> None:
    """Raise ``InvalidKeyError`` unless ``key`` is a valid key (``check_identity``'s rule)."""
    _check_text("key", key, max_key_length, allow_empty=False)


def check_fingerprint(fingerprint: object) -> None:
    """Raise ``InvalidKeyError`` unless ``fingerprint`` is valid (``check_identity``'s rule)."""
    _check_text("fingerprint", fingerprint, MAX_FINGERPRINT_LENGTH, allow_empty=False)


def check_duration(name: str, seconds: object) -> float:
    """A positive, finite number of seconds as float, or ``ConfigurationError``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, not {seconds!r}")
    try:
        value = float(seconds)
    except OverflowError:
        # An int past the largest double: no finite number of seconds.
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"{name} must be a positive, finite number of seconds, not {seconds!r}"
        )
    if value > MAX_DURATION:
        # Deadlines must stay representable on every engine (Redis keeps them in microseconds
        # as Lua numbers, DynamoDB's TTL in epoch seconds); a century is "forever" enough.
        raise ConfigurationError(
            f"{name} must be at most {MAX_DURATION:.0f} seconds (100 years), not {seconds!r}"
        )
    return value


def check_timeout(timeout: object) -> float:
    """A wait timeout: seconds, 0 or more (0 looks once; ``inf`` waits until the lease is
    settled, capped at a century), not a bool nor NaN; else ``ConfigurationError``."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigurationError(f"timeout must be 0 or more seconds, not {timeout!r}")
    try:
        value = float(timeout)
    except OverflowError:  # an int past the largest double
        value = math.inf if timeout > 0 else -math.inf
    if math.isnan(value) or value < 0:
        raise ConfigurationError(f"timeout must be 0 or more seconds, not {timeout!r}")
    return min(value, MAX_DURATION)


def check_limit(limit: object) -> int:
    """``sweep``'s batch limit: an int (not a bool) of at least 1, else ``ConfigurationError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be an int of at least 1, not {limit!r}")
    return limit


def check_response(response: object) -> bytes:
    """The response as ``bytes``; ``TypeError`` for anything that is not bytes-like."""
    if isinstance(response, bytes):
        return response
    if isinstance(response, bytearray | memoryview):
        return bytes(response)
    raise TypeError(f"response must be bytes, not {type(response).__name__}")


# Engines keep fences as signed 64-bit integers; binding a larger one raises in the driver.
_INT64_MAX = 2**63 - 1
# new_token() makes 32 hex characters; anything far longer was never issued by a store.
_MAX_TOKEN_LENGTH = 256


def lease_owns_nothing(lease: object, *, max_key_length: int = MAX_KEY_LENGTH) -> bool:
    """Whether no store could ever have issued ``lease`` (a forged or corrupted lease).

    Such a lease must fail the owner check exactly like a stale one (``complete`` and
    ``release`` return False, ``extend`` None), on every backend and without I/O, rather than
    raise from a driver or match through an engine's type conversion (text ``'1'`` against
    integer 1, ``True`` against 1, ``1.0`` against 1). A real lease has: a valid scope and
    key, a non-empty str token without NUL or lone surrogates, an int fence (not a bool) from
    1 to 2**63 - 1, and the positive finite retention ``reserve`` was given.
    """
    try:
        scope, key = lease.scope, lease.key  # type: ignore[attr-defined]
        token, fence = lease.token, lease.fence  # type: ignore[attr-defined]
        retention = lease.retention  # type: ignore[attr-defined]
    except AttributeError:
        return True
    if type(fence) is not int or not 1 <= fence <= _INT64_MAX:
        return True
    if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN_LENGTH:
        return True
    try:
        check_identity(key, scope, max_key_length=max_key_length)
        _check_text("token", token, _MAX_TOKEN_LENGTH, allow_empty=False)
        check_duration("retention", retention)
    except (InvalidKeyError, ConfigurationError):
        return True
    return False


# new_token draws from the OS's CSPRNG in batches: one os.urandom call per batch instead of a
# system call per token, the largest cost of an in-memory reserve.
_TOKEN_BYTES = 16
_TOKENS_PER_BATCH = 256
_random_tokens: list[str] = []


def _forget_tokens() -> None:
    # A forked child must never hand out the tokens its parent drew (both would own them).
    _random_tokens.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_tokens)


def new_token() -> str:
    """A fresh owner token: 128 random bits from ``os.urandom``, hex (32 characters)."""
    try:
        return _random_tokens.pop()
    except IndexError:
        batch = secrets.token_bytes(_TOKEN_BYTES * _TOKENS_PER_BATCH).hex()
        width = 2 * _TOKEN_BYTES
        _random_tokens.extend(batch[i : i + width] for i in range(0, len(batch), width))
        return _random_tokens.pop()


class RecordState(enum.StrEnum):
    """What ``ListingStore.records`` filters on: where a live record stands at the engine's
    clock. ``in_progress``: its lease is running; ``stuck``: in progress with its lease past
    its deadline and no outcome (the next ``reserve`` takes it over); ``completed``."""

    IN_PROGRESS = "in_progress"
    STUCK = "stuck"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """Which live records a listing returns, checked: ``scope`` (``None``: every scope),
    ``state`` (``None``: every state), ``older_than`` (seconds since ``created_at``, ``None``:
    any age) and at most ``limit`` of them. Every store judges a record by ``matches`` (an SQL
    store writes the same rule as its WHERE clause)."""

    scope: str | None = None
    state: RecordState | None = None
    older_than: float | None = None
    limit: int = 100

    @classmethod
    def checked(
        cls,
        scope: object = None,
        state: object = None,
        older_than: object = None,
        limit: object = 100,
    ) -> RecordQuery:
        """The query, or ``InvalidKeyError``/``ConfigurationError`` naming the bad value."""
        if scope is not None:
            _check_text("scope", scope, MAX_SCOPE_LENGTH, allow_empty=True)
        known = [s.value for s in RecordState]
        if state is not None and state not in known:
            raise ConfigurationError(f"state must be one of {', '.join(known)}, not {state!r}")
        age = None if older_than is None else check_duration("older_than", older_than)
        chosen = None if state is None else RecordState(str(state))
        return cls(scope, chosen, age, check_limit(limit))  # type: ignore[arg-type]

    def matches(self, record: Record, now: float) -> bool:
        """Whether the live ``record``, read at ``now``, is one this query lists."""
        if self.scope is not None and record.scope != self.scope:
            return False
        if self.older_than is not None and record.created_at > now - self.older_than:
            return False
        if self.state is None:
            return True
        if record.status.value == "completed":
            return self.state is RecordState.COMPLETED
        lease_end = record.lease_expires_at
        running = lease_end is not None and lease_end > now
        return self.state is (RecordState.IN_PROGRESS if running else RecordState.STUCK)
