"""Background tasks stop even when a driver swallows their cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the inner result and drops a cancellation that
arrives in the same loop iteration as that result (CPython gh-86296, fixed in 3.12), and
redis-py sends every command through ``wait_for``: cancelling a task in the middle of a Redis
call is silently ignored now and then (about one in seven in a tight loop here). A heartbeat
or sweeper that relied on ``cancel()`` alone then ran on forever, and ``Idempotency.run``
never returned after the work was done. Found by the history workers, which hung in exactly
that way after a Redis restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from idemstore import Idempotency, LeaseLostError, Sweeper, open_store
from idemstore.testing.stores import WrappedStore

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from idemstore import IdempotencyStore, Lease

T = TypeVar("T")


async def finishes(coroutine: Coroutine[Any, Any, T], within: float = 5.0) -> T:
    """The coroutine's result; fails if it is still running after ``within`` seconds.

    Not ``asyncio.wait_for``: on a timeout it waits for the cancelled call to end, which a
    call that swallows cancellations never does.
    """
    task = asyncio.ensure_future(coroutine)
    done, _ = await asyncio.wait({task}, timeout=within)
    assert done, f"still running after {within}s: hung"
    return task.result()


class SwallowsCancellation(WrappedStore):
    """A memory store whose ``extend`` and ``sweep`` ignore a cancellation that arrives while
    they run, as a redis-py call on Python 3.11 sometimes does."""

    def __init__(self, inner: IdempotencyStore) -> None:
        super().__init__(inner)
        self.busy = asyncio.Event()

    async def _swallow(self) -> None:
        self.busy.set()
        # What wait_for does when the result is ready as the cancellation lands:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.02)

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        await self._swallow()
        return await self.inner.extend(lease, lease_ttl=lease_ttl)

    async def sweep(self, *, limit: int = 1000) -> int:
        await self._swallow()
        return await self.inner.sweep(limit=limit)


async def test_run_returns_when_the_heartbeat_swallows_its_cancellation() -> None:
    async with open_store("memory://") as inner:
        store = SwallowsCancellation(inner)
        idem = Idempotency(store, lease_ttl=0.3)  # type: ignore[arg-type]

        async def work() -> bytes:
            await store.busy.wait()  # return while a heartbeat's extend is in flight
            return b"done"

        result = await finishes(idem.run("k", "fp", work))
        assert result.value == b"done"
        record = await inner.get("k")
        assert record is not None and record.response == b"done"


async def test_run_still_passes_on_its_callers_cancellation_while_stopping_the_heartbeat() -> None:
    async with open_store("memory://") as inner:
        store = SwallowsCancellation(inner)
        idem = Idempotency(store, lease_ttl=0.3)  # type: ignore[arg-type]
        finished = asyncio.Event()

        async def work() -> bytes:
            await store.busy.wait()
            finished.set()
            return b"done"

        task = asyncio.create_task(idem.run("k", "fp", work))
        await finished.wait()
        task.cancel()  # lands while run() stops the heartbeat
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "run() hung"
        assert task.cancelled()


async def test_sweeper_stops_when_a_sweep_swallows_its_cancellation() -> None:
    async with open_store("memory://") as inner:
        store = SwallowsCancellation(inner)
        sweeper = Sweeper(store, every=0.01)  # type: ignore[arg-type]
        sweeper.start()
        await store.busy.wait()
        await finishes(sweeper.stop())
        assert not sweeper.running


@pytest.mark.slow
async def test_runs_on_redis_with_a_heartbeat_always_in_flight_all_return(
    redis_store_url: str,
) -> None:
    """The real thing: heartbeats every millisecond, so the work often ends mid-extend."""
    rng = random.Random(7)
    async with open_store(redis_store_url) as store:
        idem = Idempotency(store, lease_ttl=0.003)

        async def work() -> bytes:
            await asyncio.sleep(rng.uniform(0, 0.004))
            return b"done"

        ran = 0
        for index in range(300):
            try:
                result = await finishes(idem.run(f"k{index}", "fp", work))
            except LeaseLostError:
                # A 3 ms lease can lapse before the reserve's reply arrives on a loaded
                # machine: the work is then never started, and the call still returns.
                continue
            assert result.value == b"done"
            ran += 1
        assert ran > 0
