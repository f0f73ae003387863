"""Small pure rules every backend applies alike: what a valid key is, how tokens are made."""

from __future__ import annotations

import math
import secrets
from typing import Any

from idemstore.errors import ConfigurationError, InvalidKeyError

__all__ = [
    "MAX_FINGERPRINT_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_SCOPE_LENGTH",
    "check_duration",
    "check_identity",
    "check_limit",
    "check_response",
    "check_timeout",
    "new_token",
]

MAX_KEY_LENGTH = 255
MAX_SCOPE_LENGTH = 1024
MAX_FINGERPRINT_LENGTH = 128


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
    return value


def check_timeout(timeout: object) -> float:
    """A ``wait`` timeout as float seconds: negative means 0, infinity (or an int past the
    largest double) means until the key settles; ``ConfigurationError`` for NaN or a non-number.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigurationError(f"timeout must be a number of seconds, not {timeout!r}")
    try:
        value = float(timeout)
    except OverflowError:
        value = math.inf if timeout > 0 else 0.0
    if math.isnan(value):
        raise ConfigurationError("timeout must be a number of seconds, not nan")
    return max(0.0, value)


def check_limit(limit: object) -> int:
    """A ``sweep`` batch limit: an int of at least 1, or ``ConfigurationError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be an integer of at least 1, not {limit!r}")
    return limit


def check_response(response: object) -> bytes:
    """The response as ``bytes``; ``TypeError`` for anything that is not bytes-like."""
    if isinstance(response, bytes):
        return response
    if isinstance(response, bytearray | memoryview):
        return bytes(response)
    raise TypeError(f"response must be bytes, not {type(response).__name__}")


def new_token() -> str:
    """A fresh owner token: 128 random bits, hex."""
    return secrets.token_hex(16)
