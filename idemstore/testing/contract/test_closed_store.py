"""A closed store checks in one order on every backend (issue 27): the arguments first, then
whether it is closed, then (never, once closed) its engine.

So a bad argument gets the error it gets on an open store (``InvalidKeyError``,
``ConfigurationError``, ``TypeError``), and a forged lease still owns nothing (``complete``
and ``release`` return False, ``extend`` None: the lease rule needs no engine, see
``test_forged_leases``). Only good arguments reach the closed check, which raises
``RuntimeError`` naming the store closed.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from idemstore import ConfigurationError, InvalidKeyError, Outcome

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore import IdempotencyStore, Lease

LONG = 60.0
FP = "fp-closed"


# Every operation, with good arguments (``lease`` is genuine, taken before the close).
GOOD: dict[str, Callable[[IdempotencyStore, Lease], Awaitable[Any]]] = {
    "reserve": lambda s, lease: s.reserve("k-other", FP, lease_ttl=LONG, retention=LONG),
    "complete": lambda s, lease: s.complete(lease, b"done"),
    "release": lambda s, lease: s.release(lease),
    "extend": lambda s, lease: s.extend(lease, lease_ttl=LONG),
    "get": lambda s, lease: s.get(lease.key),
    "wait": lambda s, lease: s.wait(lease.key, timeout=0),
    "delete": lambda s, lease: s.delete(lease.key),
    "sweep": lambda s, lease: s.sweep(limit=10),
}

# Each operation with one bad argument, and the error an open store raises for it.
BAD: dict[str, tuple[Callable[[IdempotencyStore, Lease], Awaitable[Any]], type[Exception]]] = {
    "reserve, empty key": (
        lambda s, lease: s.reserve("", FP, lease_ttl=LONG, retention=LONG),
        InvalidKeyError,
    ),
    "reserve, NUL in scope": (
        lambda s, lease: s.reserve("k", FP, scope="\x00", lease_ttl=LONG, retention=LONG),
        InvalidKeyError,
    ),
    "reserve, no fingerprint": (
        lambda s, lease: s.reserve("k", None, lease_ttl=LONG, retention=LONG),  # type: ignore[arg-type]
        InvalidKeyError,
    ),
    "reserve, lease_ttl 0": (
        lambda s, lease: s.reserve("k", FP, lease_ttl=0, retention=LONG),
        ConfigurationError,
    ),
    "complete, response not bytes": (
        lambda s, lease: s.complete(lease, "not bytes"),  # type: ignore[arg-type]
        TypeError,
    ),
    "complete, retention NaN": (
        lambda s, lease: s.complete(lease, b"done", retention=float("nan")),
        ConfigurationError,
    ),
    "extend, lease_ttl negative": (
        lambda s, lease: s.extend(lease, lease_ttl=-1),
        ConfigurationError,
    ),
    "get, key too long": (lambda s, lease: s.get("k" * 100_000), InvalidKeyError),
    "wait, lone surrogate in key": (
        lambda s, lease: s.wait("k\udc80", timeout=0),
        InvalidKeyError,
    ),
    "wait, negative timeout": (lambda s, lease: s.wait("k", timeout=-1), ConfigurationError),
    "delete, key None": (lambda s, lease: s.delete(None), InvalidKeyError),  # type: ignore[arg-type]
    "sweep, limit 0": (lambda s, lease: s.sweep(limit=0), ConfigurationError),
}

# A lease no store could have issued, and what each holder operation answers for it.
FORGED: dict[str, tuple[Callable[[IdempotencyStore, Lease], Awaitable[Any]], object]] = {
    "complete": (lambda s, lease: s.complete(forge(lease), b"done"), False),
    "release": (lambda s, lease: s.release(forge(lease)), False),
    "extend": (lambda s, lease: s.extend(forge(lease), lease_ttl=LONG), None),
}


def forge(lease: Lease) -> Lease:
    return dataclasses.replace(lease, fence=True)


# pytest_asyncio's own decorator: the suite runs in projects whose asyncio_mode is strict.
@pytest_asyncio.fixture
async def closed_lease(store: IdempotencyStore) -> Lease:
    """Close ``store`` once it handed out a genuine lease; give that lease."""
    reservation = await store.reserve(f"k-{uuid.uuid4().hex}", FP, lease_ttl=LONG, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    await store.close()
    return reservation.lease


@pytest.mark.parametrize("operation", list(GOOD))
async def test_a_closed_store_refuses_good_arguments_as_closed(
    store: IdempotencyStore, closed_lease: Lease, operation: str
) -> None:
    with pytest.raises(RuntimeError, match="closed"):
        await GOOD[operation](store, closed_lease)


@pytest.mark.parametrize("case", list(BAD))
async def test_a_closed_store_refuses_bad_arguments_as_an_open_one_does(
    store: IdempotencyStore, closed_lease: Lease, case: str
) -> None:
    call, error = BAD[case]
    with pytest.raises(error):
        await call(store, closed_lease)


@pytest.mark.parametrize("operation", list(FORGED))
async def test_a_forged_lease_owns_nothing_on_a_closed_store_too(
    store: IdempotencyStore, closed_lease: Lease, operation: str
) -> None:
    call, answer = FORGED[operation]
    assert await call(store, closed_lease) is answer


@pytest.mark.usefixtures("closed_lease")
async def test_closing_a_closed_store_again_is_quiet(store: IdempotencyStore) -> None:
    await store.close()
