"""The heartbeat's first beat: one clock per event loop, each keeper on its own schedule."""

from __future__ import annotations

import asyncio
import gc
import weakref

from idemstore import LeaseKeeper, open_store
from idemstore.protocol import IdempotencyStore, Lease, Outcome
from idemstore.testing.stores import WrappedStore


class _CountingExtends(WrappedStore):
    """A memory store whose ``extend`` calls are written down, by key."""

    def __init__(self, store: IdempotencyStore) -> None:
        super().__init__(store)
        self.extended: list[str] = []

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        self.extended.append(lease.key)
        return await super()._extend(lease, lease_ttl)


async def _lease(store: IdempotencyStore, key: str, lease_ttl: float) -> Lease:
    reservation = await store.reserve(key, "fp", lease_ttl=lease_ttl, retention=60)
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    return reservation.lease


async def test_keepers_started_together_each_beat_on_their_own_schedule() -> None:
    async with open_store("memory://") as inner:
        store = _CountingExtends(inner)
        # Started latest-first: the last keeper's first beat is due sooner than the one the
        # clock waits for, and one keeper never gets there (stopped first).
        late = LeaseKeeper(store, await _lease(inner, "late", 1.2), 1.2)
        stopped = LeaseKeeper(store, await _lease(inner, "stopped", 0.6), 0.6)
        soon = LeaseKeeper(store, await _lease(inner, "soon", 3), 3, first_beat=0.05)
        await stopped.stop()
        await asyncio.sleep(0.2)  # soon's first beat was due at 0.05 s; late's is at 0.4 s
        assert store.extended == ["soon"]
        await asyncio.sleep(0.4)  # late's next beat is at 0.8 s, soon's at 1.05 s
        assert store.extended == ["soon", "late"]
        assert late.running and soon.running and not stopped.running
        for keeper in (late, soon):
            latest = await keeper.stop()
            assert await inner.complete(latest, b"done")
        assert not late.running and not soon.running


async def test_a_keeper_still_waiting_when_the_clock_fires_beats_at_its_own_time() -> None:
    async with open_store("memory://") as inner:
        store = _CountingExtends(inner)
        first = LeaseKeeper(store, await _lease(inner, "first", 1.5), 1.5)
        await asyncio.sleep(0.2)
        second = LeaseKeeper(store, await _lease(inner, "second", 1.5), 1.5)
        await asyncio.sleep(0.4)  # the clock fired for first (0.5 s); second is due at 0.7 s
        assert store.extended == ["first"]
        await asyncio.sleep(0.25)
        assert store.extended == ["first", "second"]
        await first.stop()
        await second.stop()


class _SlowExtends(WrappedStore):
    """A memory store whose ``extend`` takes ``delay`` seconds each way to and from the store."""

    def __init__(self, store: IdempotencyStore, delay: float) -> None:
        super().__init__(store)
        self.delay = delay

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        await asyncio.sleep(self.delay)
        extended = await super()._extend(lease, lease_ttl)
        await asyncio.sleep(self.delay)
        return extended


async def test_slow_extends_do_not_push_the_next_beat_past_the_lease() -> None:
    """Each beat counts from when the last was sent: counted from its reply, the 1.1 s round
    trip plus a third of the 1.5-s lease would leave the lease lapsed for 0.1 s a beat, and a
    caller asking all along would take the key over."""
    ttl, way = 1.5, 0.55
    async with open_store("memory://") as inner:
        keeper = LeaseKeeper(_SlowExtends(inner, way), await _lease(inner, "slow", ttl), ttl)
        loop = asyncio.get_running_loop()
        until = loop.time() + 3.2
        while loop.time() < until:
            other = await inner.reserve("slow", "fp", lease_ttl=ttl, retention=60)
            assert other.outcome is Outcome.IN_PROGRESS, "the key was taken over between beats"
            await asyncio.sleep(0.02)
        assert keeper.running and not keeper.lapsed
        assert await inner.complete(await keeper.stop(), b"done")


def test_a_loop_closed_with_keepers_waiting_is_not_kept_alive() -> None:
    loop = asyncio.new_event_loop()

    async def leave_a_keeper_waiting() -> None:
        async with open_store("memory://") as store:
            LeaseKeeper(store, await _lease(store, "left", 30), 30)

    loop.run_until_complete(leave_a_keeper_waiting())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
