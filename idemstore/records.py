"""Small pure rules every backend applies alike: what a valid key is, how tokens are made."""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError, InvalidKeyError

if TYPE_CHECKING:
    from idemstore.protocol import Lease

__all__ = [
    "MAX_DURATION",
    "MAX_FINGERPRINT_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_SCOPE_LENGTH",
    "check_duration",
    "check_identity",
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
_INT64 = range(-(2**63), 2**63)


def lease_owns_nothing(lease: Lease) -> bool:
    """Whether no stored record could hold ``lease``'s token and fence (a forged or corrupted
    lease): it must fail the owner check like any stale lease, without I/O, rather than raise
    from the driver or match through an engine's type conversion (text ``'1'`` vs integer 1)."""
    fence, token = lease.fence, lease.token
    if isinstance(fence, bool) or not isinstance(fence, int) or fence not in _INT64:
        return True
    if not isinstance(token, str):
        return True
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def new_token() -> str:
    """A fresh owner token: 128 random bits, hex."""
    return secrets.token_hex(16)
