"""What every store operation checks before any I/O, the same way on every backend.

A backend author calls one function at the top of each operation and uses what it returns:

- ``reserve_arguments``: identity, fingerprint and the two durations (as floats);
- ``lookup_arguments``: the identity of ``get`` and ``delete``;
- ``wait_arguments``: the identity and the timeout of ``wait``;
- ``complete_arguments``: the response (as bytes) and the retention to keep it for, or
  ``None`` when the lease owns nothing (then ``complete`` returns False without I/O);
- ``lease_arguments``: for ``release`` and ``extend``, False when the lease owns nothing
  (``release`` returns False and ``extend`` None, without I/O);
- ``retention_while_held``: how long a record in progress lives after a reserve or extend
  (never less than its lease: a live lease keeps its record alive).

Bad arguments raise ``InvalidKeyError``, ``ConfigurationError`` or ``TypeError``; a forged or
corrupted lease is never an error, it is a lease that owns nothing (see
``idemstore.records.lease_owns_nothing``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from idemstore.records import (
    check_duration,
    check_fingerprint,
    check_identity,
    check_key,
    check_response,
    check_timeout,
    lease_owns_nothing,
)

if TYPE_CHECKING:
    from idemstore.protocol import Lease

__all__ = [
    "complete_arguments",
    "lease_arguments",
    "lookup_arguments",
    "reserve_arguments",
    "retention_while_held",
    "wait_arguments",
]


def reserve_arguments(
    key: str,
    fingerprint: str,
    scope: str,
    lease_ttl: float,
    retention: float,
    *,
    max_key_length: int,
) -> tuple[float, float]:
    """``(lease_ttl, retention)`` as floats, once key, scope and fingerprint are valid."""
    # A caller repeats its scope and durations far more often than its keys: their verdicts
    # are remembered (str and float are immutable, so a verdict cannot go stale). Only exact
    # str, float and int take the cache: a subclass could compare equal to a valid value yet
    # be one the engines cannot store. Fingerprints are checked each time: most differ from
    # call to call, and would only churn the cache.
    check_key(key, max_key_length=max_key_length)
    check_fingerprint(fingerprint)
    if (
        type(scope) is str
        and type(lease_ttl) in _PLAIN_NUMBERS
        and type(retention) in _PLAIN_NUMBERS
    ):
        return _valid_settings(scope, lease_ttl, retention)
    check_identity(key, scope, max_key_length=max_key_length)
    return check_duration("lease_ttl", lease_ttl), check_duration("retention", retention)


_PLAIN_NUMBERS = (float, int)


@functools.lru_cache(maxsize=256)
def _valid_settings(scope: str, lease_ttl: float, retention: float) -> tuple[float, float]:
    # Invalid settings raise, and lru_cache remembers only settings that passed.
    check_identity("k", scope)
    return check_duration("lease_ttl", lease_ttl), check_duration("retention", retention)


def lookup_arguments(key: str, scope: str, *, max_key_length: int) -> None:
    """Raise unless ``key`` and ``scope`` are an identity a record could have."""
    check_identity(key, scope, max_key_length=max_key_length)


def wait_arguments(key: str, scope: str, timeout: float, *, max_key_length: int) -> float:
    """The timeout in seconds (0 or more), once the identity is valid."""
    check_identity(key, scope, max_key_length=max_key_length)
    return check_timeout(timeout)


def complete_arguments(
    lease: Lease,
    response: bytes,
    retention: float | None,
    *,
    max_key_length: int,
    issued: bool = False,
) -> tuple[bytes, float] | None:
    """``(response, retention)`` for ``complete``, or None when ``lease`` owns nothing.

    A response that is not bytes-like and an explicit retention that is not a duration are
    errors whatever the lease; the lease's own retention is part of the lease (checked by the
    owner rule), so a corrupted one makes the lease own nothing. ``issued``: the store knows
    it handed out this very lease object, which then needs no owner checks.
    """
    body = check_response(response)
    keep = None if retention is None else check_duration("retention", retention)
    if not issued and lease_owns_nothing(lease, max_key_length=max_key_length):
        return None
    return body, keep if keep is not None else float(lease.retention)


def lease_arguments(lease: Lease, *, max_key_length: int) -> bool:
    """Whether ``lease`` could be held at all; False means: fail the owner check, no I/O."""
    return not lease_owns_nothing(lease, max_key_length=max_key_length)


def retention_while_held(lease_ttl: float, retention: float) -> float:
    """Seconds from a reserve or extend until a record in progress expires.

    Retention counts from the holder's last reserve or extend and never ends before the
    lease does, so a live lease, however it was extended, keeps its record (and its fence)
    alive. ``complete`` restarts retention from the completion.
    """
    return max(lease_ttl, retention)
