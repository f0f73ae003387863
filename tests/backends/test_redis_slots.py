"""The Redis store's in-flight limit (``max_connections``): one operation per pooled connection,
first come first served beyond that, and no slot lost to a wait that ends early."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from idemstore import Outcome, StoreUnavailableError, open_store
from idemstore.backends.redis.slots import ConnectionSlots

pytest.importorskip("redis", reason="redis-py is not installed: pip install '.[redis]'")

import redis.asyncio as aioredis


async def test_waiters_are_served_in_arrival_order() -> None:
    slots = ConnectionSlots(1)
    assert slots.take_now()
    served: list[int] = []

    async def holder(n: int) -> None:
        await slots.take(10)
        served.append(n)
        await asyncio.sleep(0)
        slots.give()

    tasks = [asyncio.create_task(holder(n)) for n in range(5)]
    await asyncio.sleep(0)  # all five queue behind the taken slot
    slots.give()
    await asyncio.gather(*tasks)
    assert served == [0, 1, 2, 3, 4]
    assert slots.take_now() and not slots.take_now()


async def test_a_wait_that_times_out_loses_no_slot() -> None:
    slots = ConnectionSlots(1)
    assert slots.take_now()
    with pytest.raises(TimeoutError):
        await slots.take(0.01)
    slots.give()
    assert slots.take_now() and not slots.take_now()


async def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on() -> None:
    slots = ConnectionSlots(1)
    assert slots.take_now()
    first = asyncio.create_task(slots.take(10))
    second = asyncio.create_task(slots.take(10))
    await asyncio.sleep(0)
    slots.give()  # handed to first, which is cancelled before it runs again
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the slot went on to the next waiter
    assert not slots.take_now()
    slots.give()
    assert slots.take_now()


async def test_more_concurrent_reserves_than_connections_all_run_on_that_many(
    redis_store_url: str,
) -> None:
    url = redis_store_url + ("&" if "?" in redis_store_url else "?") + "max_connections=2"
    probe = aioredis.Redis.from_url(redis_store_url.split("?")[0])
    try:
        before = {c["id"] for c in await probe.client_list()}
        async with open_store(url) as store:
            await store.ping()
            run = uuid.uuid4().hex
            reservations = await asyncio.gather(
                *(store.reserve(f"{run}:{i}", "fp", lease_ttl=60, retention=60) for i in range(64))
            )
            assert all(r.outcome is Outcome.ACQUIRED for r in reservations)
            opened = [c for c in await probe.client_list() if c["id"] not in before]
            assert 1 <= len(opened) <= 2, opened
    finally:
        await probe.aclose()


async def test_an_operation_that_finds_every_slot_busy_too_long_is_store_unavailable(
    redis_store_url: str,
) -> None:
    url = redis_store_url + ("&" if "?" in redis_store_url else "?")
    url += "max_connections=1&socket_timeout=0.5"
    async with open_store(url) as store:
        await store.ping()
        # Hold the one slot with a wait that cannot finish before the next call gives up.
        assert store._slots.take_now()
        try:
            with pytest.raises(StoreUnavailableError, match="max_connections"):
                await store.reserve(uuid.uuid4().hex, "fp", lease_ttl=60, retention=60)
        finally:
            store._slots.give()
        reservation = await store.reserve(uuid.uuid4().hex, "fp", lease_ttl=60, retention=60)
        assert reservation.outcome is Outcome.ACQUIRED
