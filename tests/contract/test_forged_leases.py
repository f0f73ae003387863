"""A lease that is not a real lease fails the owner check the same way on every backend
(issue 13, case 4): ``complete`` and ``release`` return False, ``extend`` returns None. It is
never a driver error and never matches a record through an engine's type conversion."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Outcome, Status

if TYPE_CHECKING:
    from idemstore import IdempotencyStore, Lease

LONG = 60.0

# Each turns the genuine lease (fence 1) into one no store could have issued. The fence
# look-alikes (True, "1", 1.0) equal 1 in some engine or driver, so they would match.
FORGERIES: dict[str, dict[str, Any]] = {
    "token None": {"token": None},
    "token empty": {"token": ""},
    "token bytes": {"token": b"0123"},
    "token with NUL": {"token": "abc\x00def"},
    "token with a lone surrogate": {"token": "abc\udc80"},
    "fence True": {"fence": True},
    "fence '1'": {"fence": "1"},
    "fence 1.0": {"fence": 1.0},
    "fence None": {"fence": None},
    "fence 0": {"fence": 0},
    "fence past int64": {"fence": 2**63},
    "scope with NUL": {"scope": "\x00"},
    "key None": {"key": None},
    "key too long": {"key": "k" * 10_000},
    "retention NaN": {"retention": float("nan")},
    "retention None": {"retention": None},
}


async def genuine(store: IdempotencyStore) -> Lease:
    reservation = await store.reserve(f"k-{uuid.uuid4().hex}", "fp", lease_ttl=LONG, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    assert reservation.lease.fence == 1
    return reservation.lease


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_a_forged_lease_owns_nothing(store: IdempotencyStore, forgery: str) -> None:
    lease = await genuine(store)
    forged = dataclasses.replace(lease, **FORGERIES[forgery])
    assert await store.complete(forged, b"forged") is False
    assert await store.complete(forged, b"forged", retention=LONG) is False
    assert await store.extend(forged, lease_ttl=LONG) is None
    assert await store.release(forged) is False
    record = await store.get(lease.key)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.token == lease.token and record.fence == 1
    assert await store.complete(lease, b"genuine") is True


async def test_a_forged_lease_is_refused_before_a_bad_response_is_ignored(
    store: IdempotencyStore,
) -> None:
    """Argument errors stay errors whatever the lease: a response that is not bytes is a
    TypeError even when the lease is forged."""
    lease = await genuine(store)
    forged = dataclasses.replace(lease, token=None)
    with pytest.raises(TypeError):
        await store.complete(forged, "not bytes")  # type: ignore[arg-type]
    assert await store.release(lease) is True
