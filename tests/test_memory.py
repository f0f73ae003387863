"""Memory-specific behaviour, with an injected clock instead of sleeps."""

from __future__ import annotations

from idemstore import Outcome
from idemstore.backends.memory import MemoryStore
from idemstore.testing import FakeClock


async def complete_keys(store: MemoryStore, count: int, *, retention: float) -> None:
    """Reserve and complete ``count`` keys (``k0``, ``k1``…) kept for ``retention`` seconds."""
    for i in range(count):
        reservation = await store.reserve(f"k{i}", "fp", lease_ttl=1, retention=retention)
        assert reservation.lease is not None
        await store.complete(reservation.lease, b"x")


async def test_injected_clock_decides_lease_expiry() -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    first = await store.reserve("k", "fp", lease_ttl=30, retention=3600)
    clock.advance(29.9)
    assert (
        await store.reserve("k", "fp", lease_ttl=30, retention=3600)
    ).outcome is Outcome.IN_PROGRESS
    clock.advance(0.2)
    second = await store.reserve("k", "fp", lease_ttl=30, retention=3600)
    assert second.outcome is Outcome.ACQUIRED and second.takeover
    assert first.lease is not None and second.lease is not None
    assert second.lease.fence == first.lease.fence + 1


async def test_sweep_removes_expired_in_bounded_batches() -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    await complete_keys(store, 25, retention=10)
    await store.reserve("live", "fp", lease_ttl=1, retention=1000)
    clock.advance(11)
    assert await store.sweep(limit=10) == 10
    assert await store.sweep(limit=10) == 10
    assert await store.sweep(limit=10) == 5
    assert await store.sweep(limit=10) == 0
    assert await store.get("live") is not None


async def test_fence_keeps_rising_after_a_record_expires_but_is_not_swept() -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    r1 = await store.reserve("k", "fp", lease_ttl=1, retention=10)
    clock.advance(11)
    r2 = await store.reserve("k", "fp", lease_ttl=1, retention=10)
    assert r1.lease is not None and r2.lease is not None
    assert r2.lease.fence == r1.lease.fence + 1
    assert await store.complete(r1.lease, b"stale") is False
