"""The Redis store's attempts: bounded by one timer for all, as ``asyncio.timeout`` bounds one;
retried with the pauses of ``REDIS_TIMEOUTS``."""

from __future__ import annotations

import asyncio
from itertools import islice

import pytest

from idemstore.backends.backoff import REDIS_TIMEOUTS
from idemstore.backends.redis.deadlines import Deadlines
from idemstore.backends.redis.store import AFTER_FIRST_RETRY

# Long enough for a quick attempt to finish first on a loaded machine, short for a test.
TIMEOUT = 0.2


async def bounded(deadlines: Deadlines, waited: asyncio.Future[str]) -> str:
    """An attempt as the store's ``_attempt`` runs one."""
    bound = deadlines.start()
    try:
        return await waited
    except asyncio.CancelledError as exc:
        if bound.timed_out():
            raise TimeoutError from exc
        raise
    finally:
        bound.end()


async def test_an_attempt_past_its_deadline_raises_timeout_and_leaves_its_task_clean() -> None:
    deadlines = Deadlines(TIMEOUT)
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def caller() -> int:
        with pytest.raises(TimeoutError):
            await bounded(deadlines, never)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert await caller() == 0


async def test_each_of_several_attempts_runs_out_on_its_own_deadline() -> None:
    deadlines = Deadlines(TIMEOUT)
    loop = asyncio.get_running_loop()
    hung = [loop.create_future() for _ in range(3)]
    answered: asyncio.Future[str] = loop.create_future()
    calls = [asyncio.ensure_future(bounded(deadlines, f)) for f in hung]
    quick = asyncio.ensure_future(bounded(deadlines, answered))
    await asyncio.sleep(0)
    answered.set_result("reply")
    assert await quick == "reply"
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(o) for o in outcomes] == [TimeoutError] * 3
    # The store keeps going: a later attempt has a bound of its own.
    later: asyncio.Future[str] = loop.create_future()
    loop.call_soon(later.set_result, "later")
    assert await bounded(deadlines, later) == "later"


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadlines = Deadlines(TIMEOUT)
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.ensure_future(bounded(deadlines, never))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # Its bound, ended, cancels nothing when its deadline passes.
    await asyncio.sleep(TIMEOUT * 2)


async def test_a_bound_that_fires_on_an_attempt_that_swallows_it_is_taken_back() -> None:
    deadlines = Deadlines(TIMEOUT)
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def swallowing() -> int:
        bound = deadlines.start()
        try:
            await never
        except asyncio.CancelledError:
            pass  # as code that turns a cancellation into something else would
        finally:
            bound.end()
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert await swallowing() == 0


async def test_attempts_on_a_new_event_loop_are_bounded_there() -> None:
    deadlines = Deadlines(TIMEOUT)

    def on_own_loop() -> None:
        async def hang() -> None:
            never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            with pytest.raises(TimeoutError):
                await bounded(deadlines, never)

        asyncio.run(hang())

    await asyncio.to_thread(on_own_loop)
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await bounded(deadlines, never)


def test_the_retries_after_a_first_stalled_attempt_pause_as_the_whole_loop_would() -> None:
    # The store makes its first attempt outside ``retrying``, then sleeps REDIS_TIMEOUTS'
    # first pause and hands the rest to ``retrying`` with AFTER_FIRST_RETRY.
    count = 8
    whole = list(islice(REDIS_TIMEOUTS.pauses(), count))
    assert [whole[0], *islice(AFTER_FIRST_RETRY.pauses(), count - 1)] == whole
