"""``CachedStore``: what it serves from process memory, for how long, and what it never serves.

The rules are checked on a memory store with a ``FakeClock`` (time moves by assignment, not by
sleeping); the concurrent callers run on every engine of the contract fixtures. A record
removed from the wrapped store behind the cache's back (``store.wrapped.delete``) shows what
the cache answered by itself.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import ConfigurationError, Idempotency, InvalidKeyError, Outcome, fingerprint
from idemstore.backends.cached import CachedStore
from idemstore.backends.memory import MemoryStore
from idemstore.testing import FakeClock
from idemstore.testing.stores import WrappedStore

if TYPE_CHECKING:
    from idemstore import IdempotencyStore, Reservation

LONG = 3600.0
FP = "fp-1"


def cached(
    clock: FakeClock, *, engine_clock: FakeClock | None = None, **options: Any
) -> CachedStore:
    """A cache over a memory store, both on ``clock`` (the store on ``engine_clock`` if given)."""
    store = MemoryStore(clock=engine_clock or clock)
    return CachedStore(store, clock=clock, monotonic=clock, **options)


async def completed(
    store: IdempotencyStore, key: str, response: bytes = b"done", *, retention: float = LONG
) -> Reservation:
    """Run ``key`` once through ``store`` and return the replay that caches its record."""
    first = await store.reserve(key, FP, lease_ttl=30, retention=retention)
    assert first.lease is not None
    assert await store.complete(first.lease, response)
    replay = await store.reserve(key, FP, lease_ttl=30, retention=retention)
    assert replay.outcome is Outcome.COMPLETED
    return replay


async def test_a_replay_of_a_cached_key_is_answered_without_the_store() -> None:
    store = cached(FakeClock())
    replay = await completed(store, "k")
    await store.wrapped.delete("k")  # behind the cache's back: only the cache still has it
    again = await store.reserve("k", FP, lease_ttl=30, retention=LONG)
    assert again.outcome is Outcome.COMPLETED
    assert again.record == replay.record
    assert await store.get("k") == replay.record
    assert await store.wait("k", timeout=0) == replay.record
    assert store.cache_info().hits == 3


async def test_another_fingerprint_on_a_cached_key_is_a_mismatch_carrying_the_record() -> None:
    store = cached(FakeClock())
    replay = await completed(store, "k")
    await store.wrapped.delete("k")
    other = await store.reserve("k", "fp-other", lease_ttl=30, retention=LONG)
    assert other.outcome is Outcome.MISMATCH
    assert other.record == replay.record
    assert other.lease is None


async def test_a_record_in_progress_is_never_cached() -> None:
    store = cached(FakeClock())
    first = await store.reserve("k", FP, lease_ttl=30, retention=LONG)
    busy = await store.reserve("k", FP, lease_ttl=30, retention=LONG)
    assert busy.outcome is Outcome.IN_PROGRESS
    assert await store.get("k") is not None
    assert store.cache_info().entries == 0
    assert first.lease is not None
    assert await store.complete(first.lease, b"done")
    # The replay reads the completed record from the store, not the in-progress one.
    replay = await store.reserve("k", FP, lease_ttl=30, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None
    assert replay.record.response == b"done"


async def test_a_cached_record_is_never_served_past_its_retention_less_the_margin() -> None:
    clock = FakeClock()
    store = cached(clock, clock_margin=1.0)
    await completed(store, "k", retention=10.0)
    await store.wrapped.delete("k")
    clock.advance(8.9)
    assert await store.get("k") is not None  # still within retention - margin: the cache
    clock.advance(0.2)
    assert await store.get("k") is None  # 9.1 s: past retention - margin, asks the store


async def test_an_engine_clock_ahead_by_less_than_the_margin_never_sees_a_stale_replay() -> None:
    clock = FakeClock()
    engine = clock.skewed(by=0.9)
    store = cached(clock, engine_clock=engine, clock_margin=1.0)
    await completed(store, "k", retention=10.0)
    await store.wrapped.delete("k")  # what the cache still serves, it serves by itself
    # The record ends at engine time +10 s, which is local time +10 s less the 0.9 s skew
    # the record was written with: +10.0 s here. The cache lets it go before that.
    clock.advance(9.95)
    assert await store.get("k") is None


async def test_a_record_with_less_retention_left_than_the_margin_is_not_cached() -> None:
    store = cached(FakeClock(), clock_margin=1.0)
    await completed(store, "k", retention=0.5)
    assert store.cache_info().entries == 0


async def test_max_age_bounds_how_long_a_key_deleted_elsewhere_still_replays() -> None:
    clock = FakeClock()
    store = cached(clock, max_age=5.0)
    await completed(store, "k")
    await store.wrapped.delete("k")  # another process's delete: this cache cannot hear of it
    clock.advance(4.9)
    assert (await store.reserve("k", FP, lease_ttl=30, retention=LONG)).outcome is (
        Outcome.COMPLETED
    )
    clock.advance(0.2)
    assert (await store.reserve("k", FP, lease_ttl=30, retention=LONG)).acquired


async def test_a_delete_through_the_cache_drops_the_key() -> None:
    store = cached(FakeClock())
    await completed(store, "k")
    assert await store.delete("k")
    assert await store.get("k") is None
    assert (await store.reserve("k", FP, lease_ttl=30, retention=LONG)).acquired


async def test_a_release_through_the_cache_drops_the_key() -> None:
    store = cached(FakeClock())
    await completed(store, "k")
    await store.wrapped.delete("k")
    taken = await store.wrapped.reserve("k", FP, lease_ttl=30, retention=LONG)
    assert taken.lease is not None
    assert await store.release(taken.lease)
    assert (await store.reserve("k", FP, lease_ttl=30, retention=LONG)).acquired


class _HeldReads(WrappedStore):
    """A store whose reads return only when the test lets them (``gate``)."""

    def __init__(self, inner: IdempotencyStore) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.read = asyncio.Event()

    async def reserve(self, *args: Any, **kwargs: Any) -> Reservation:
        answer: Reservation = await self.inner.reserve(*args, **kwargs)
        self.read.set()
        await self.gate.wait()
        return answer


async def test_a_read_in_flight_across_a_delete_does_not_put_the_record_back() -> None:
    clock = FakeClock()
    inner = MemoryStore(clock=clock)
    await completed(inner, "k")
    store = CachedStore(_HeldReads(inner), clock=clock, monotonic=clock)
    replay = asyncio.create_task(store.reserve("k", FP, lease_ttl=30, retention=LONG))
    await store.wrapped.read.wait()  # the old record is read, its answer not yet back
    assert await store.delete("k")
    store.wrapped.gate.set()
    assert (await replay).outcome is Outcome.COMPLETED
    assert store.cache_info().entries == 0
    assert await store.get("k") is None


async def test_the_least_recently_used_record_goes_first_past_max_entries() -> None:
    store = cached(FakeClock(), max_entries=2)
    await completed(store, "a")
    await completed(store, "b")
    await store.get("a")  # a is now the most recently used
    await completed(store, "c")
    held = {record.key for record in [await store.get(k) for k in "abc"] if record}
    assert held == {"a", "b", "c"}  # the store still has all three
    for key in "abc":
        await store.wrapped.delete(key)
    # ...but only the two most recent reads are still answered from memory.
    assert [await store.get(k) is not None for k in "abc"] == [False, True, True]


async def test_max_bytes_bounds_the_responses_held() -> None:
    store = cached(FakeClock(), max_bytes=10)
    await completed(store, "big", b"x" * 11)
    assert store.cache_info().entries == 0
    await completed(store, "a", b"x" * 6)
    await completed(store, "b", b"y" * 4)
    assert store.cache_info().bytes == 10
    await completed(store, "c", b"z")
    info = store.cache_info()
    assert (info.entries, info.bytes) == (2, 5)  # "a" went first


async def test_bad_arguments_on_a_cached_key_raise_what_the_store_raises() -> None:
    store = cached(FakeClock())
    await completed(store, "k")
    with pytest.raises(ConfigurationError):
        await store.reserve("k", FP, lease_ttl=0, retention=LONG)
    with pytest.raises(InvalidKeyError):
        await store.reserve("k", None, lease_ttl=30, retention=LONG)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        await store.wait("k", timeout=-1)
    with pytest.raises(InvalidKeyError):
        await store.get(["k"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_entries", 0),
        ("max_entries", 1.5),
        ("max_bytes", 0),
        ("max_age", 0),
        ("max_age", float("inf")),
        ("clock_margin", -1),
        ("clock_margin", True),
    ],
)
def test_a_bad_option_is_refused_naming_it(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        CachedStore(MemoryStore(), **{option: value})


async def test_a_closed_cache_serves_nothing() -> None:
    store = cached(FakeClock())
    await completed(store, "k")
    await store.close()
    assert store.cache_info().entries == 0
    with pytest.raises(RuntimeError, match="closed"):
        await store.reserve("k", FP, lease_ttl=30, retention=LONG)


async def test_concurrent_callers_through_the_cache_execute_each_key_exactly_once(
    store: IdempotencyStore,
) -> None:
    cache = CachedStore(store, max_entries=100)
    idem = Idempotency(cache, lease_ttl=30, retention=LONG)
    keys = [f"race-{i}-{uuid.uuid4().hex[:8]}" for i in range(5)]
    executions: dict[str, int] = dict.fromkeys(keys, 0)

    async def call(key: str) -> bytes:
        async def work() -> bytes:
            executions[key] += 1
            await asyncio.sleep(0.01)
            return f"{key}:{uuid.uuid4().hex}".encode()

        return (await idem.run(key, fingerprint({"k": key}), work)).value

    # Two waves: the first races for the keys, the second replays them (from memory).
    callers = [key for key in keys for _ in range(6)]
    by_key: dict[str, set[bytes]] = {}
    for _ in range(2):
        values = await asyncio.gather(*(call(key) for key in callers))
        assert executions == dict.fromkeys(keys, 1)
        for key, value in zip(callers, values, strict=True):
            by_key.setdefault(key, set()).add(value)
        assert all(len(seen) == 1 for seen in by_key.values())  # one outcome, both waves
    assert cache.cache_info().hits >= len(keys) * 6
