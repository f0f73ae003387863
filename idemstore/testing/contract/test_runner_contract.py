"""The policy runner (``Idempotency``) over every backend."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import (
    ConflictError,
    Idempotency,
    IdempotencyStore,
    InProgressError,
    Outcome,
    fingerprint,
)
from idemstore.protocol import answers_inline
from idemstore.testing.contract.test_store_contract import BRIEF
from idemstore.testing.stores import SizeLimitedStore
from idemstore.testing.work import raises, returns

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def new_key() -> str:
    return f"run-{uuid.uuid4().hex}"


class Counted:
    """Work for the runner that counts its runs: run n does ``outcomes[n - 1]``, the last one
    for every run after (so work that fails once, then succeeds, is two outcomes)."""

    def __init__(self, *outcomes: Callable[[], Awaitable[bytes]]) -> None:
        self.runs = 0
        self._outcomes = outcomes

    async def __call__(self) -> bytes:
        self.runs += 1
        return await self._outcomes[min(self.runs, len(self._outcomes)) - 1]()


async def test_fifty_concurrent_runs_execute_once(store: IdempotencyStore) -> None:
    idem = Idempotency(store, lease_ttl=10)
    key, fp = new_key(), fingerprint({"amount": 42})

    async def slow_charge() -> bytes:
        await asyncio.sleep(0.1)
        return b"charged"

    charge = Counted(slow_charge)
    results = await asyncio.gather(*(idem.run(key, fp, charge) for _ in range(50)))
    assert charge.runs == 1
    assert {r.value for r in results} == {b"charged"}
    assert sum(not r.replayed for r in results) == 1
    assert len({r.fence for r in results}) == 1


async def test_a_retry_after_completion_replays(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    key = new_key()
    work = Counted(returns(b"v"))
    first = await idem.run(key, "fp", work)
    second = await idem.run(key, "fp", work)
    assert (first.replayed, second.replayed) == (False, True)
    assert second.value == first.value and second.fence == first.fence
    assert work.runs == 1


@pytest.mark.parametrize(
    "policy",
    [{"in_flight": "reject"}, {"wait_timeout": 0.2}],
    ids=["reject-policy", "wait-timeout"],
)
async def test_a_run_while_another_is_in_flight_raises_in_progress(
    store: IdempotencyStore, policy: dict[str, Any]
) -> None:
    idem = Idempotency(store, **policy)
    key = new_key()
    started = asyncio.Event()
    finish = asyncio.Event()

    async def slow() -> bytes:
        started.set()
        await finish.wait()
        return b"slow"

    original = asyncio.create_task(idem.run(key, "fp", slow))
    await started.wait()
    with pytest.raises(InProgressError) as caught:
        await idem.run(key, "fp", slow)
    assert caught.value.key == key
    finish.set()
    assert (await original).value == b"slow"


async def test_other_arguments_raise_conflict(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    key = new_key()

    work = returns(b"x")
    await idem.run(key, fingerprint({"a": 1}), work)
    with pytest.raises(ConflictError) as caught:
        await idem.run(key, fingerprint({"a": 2}), work)
    assert caught.value.record is not None


async def test_release_policy_lets_a_retry_run_again(store: IdempotencyStore) -> None:
    idem = Idempotency(store, on_failure="release")
    key = new_key()
    flaky = Counted(raises(RuntimeError("transient")), returns(b"second time lucky"))
    with pytest.raises(RuntimeError):
        await idem.run(key, "fp", flaky)
    result = await idem.run(key, "fp", flaky)
    assert result.value == b"second time lucky" and not result.replayed
    assert flaky.runs == 2
    assert result.fence == 2


async def test_hold_policy_keeps_the_key_locked_until_the_lease_lapses(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store, on_failure="hold", lease_ttl=0.6, in_flight="reject")
    key = new_key()

    boom = raises(RuntimeError("unknown outcome"))
    with pytest.raises(RuntimeError):
        await idem.run(key, "fp", boom)
    with pytest.raises(InProgressError):
        await idem.run(key, "fp", boom)
    await asyncio.sleep(0.9)

    result = await idem.run(key, "fp", returns(b"ran after the lease lapsed"))
    assert result.value == b"ran after the lease lapsed"


async def test_cancellation_releases_the_key(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    key = new_key()
    started = asyncio.Event()

    async def forever() -> bytes:
        started.set()
        await asyncio.sleep(3600)
        return b"never"

    task = asyncio.create_task(idem.run(key, "fp", forever))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.get(key) is None
    reservation = await store.reserve(key, "fp", lease_ttl=5, retention=5)
    assert reservation.outcome is Outcome.ACQUIRED


async def test_heartbeat_keeps_a_long_run_owned(store: IdempotencyStore) -> None:
    # Three leases long. A lease of 1 s: with 0.4 s, one extend held up 0.27 s by a loaded
    # machine (three CI lanes on two cores, through pgbouncer) let the lease lapse.
    idem = Idempotency(store, lease_ttl=1.0)
    key = new_key()
    probes: list[Outcome] = []

    async def long_work() -> bytes:
        for _ in range(4):
            await asyncio.sleep(0.75)
            probe = await store.reserve(key, "fp", lease_ttl=1.0, retention=60)
            probes.append(probe.outcome)
        return b"finished"

    result = await idem.run(key, "fp", long_work)
    assert probes == [Outcome.IN_PROGRESS] * 4
    assert not result.replayed
    record = await store.get(key)
    assert record is not None and record.response == b"finished"


async def test_lost_lease_returns_the_value_without_storing_it(
    store: IdempotencyStore, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idempotency(store, lease_ttl=5)
    key = new_key()

    async def work_that_loses_its_key() -> bytes:
        # Someone deletes the record under us (an operator, or retention running out).
        await store.delete(key)
        taken = await store.reserve(key, "fp", lease_ttl=60, retention=60)
        assert taken.outcome is Outcome.ACQUIRED
        return b"mine"

    with caplog.at_level(logging.WARNING, logger="idemstore.runner"):
        result = await idem.run(key, "fp", work_that_loses_its_key)
    assert result.value == b"mine" and not result.replayed
    record = await store.get(key)
    assert record is not None and record.response is None
    assert "was lost" in caplog.text


async def test_work_must_return_bytes_and_a_retry_never_runs_it_again(
    store: IdempotencyStore,
) -> None:
    from idemstore import UnrecordableResultError

    idem = Idempotency(store)
    key = new_key()
    wrong = Counted(returns("text"))  # type: ignore[arg-type]
    # The work ran (its side effects happened): the key records that its result could not
    # be recorded, and retries get that error rather than a second run.
    for _ in range(2):
        with pytest.raises(UnrecordableResultError, match="bytes") as caught:
            await idem.run(key, "fp", wrong)
        assert isinstance(caught.value, TypeError)
    assert wrong.runs == 1


async def test_decorated_function_runs_once_per_key(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    charges: list[tuple[str, int]] = []

    @idem.idempotent(key="order_id", scope=lambda order_id, amount: "shop")
    async def charge(order_id: str, amount: int) -> dict[str, object]:
        charges.append((order_id, amount))
        return {"order": order_id, "charged": amount}

    order = new_key()
    first = await charge(order, 42)
    second = await charge(order_id=order, amount=42)
    assert first == second == {"order": order, "charged": 42}
    assert charges == [(order, 42)]
    with pytest.raises(ConflictError):
        await charge(order, 43)
    assert await store.get(order, scope="shop") is not None


async def test_a_result_too_large_to_store_is_returned_and_retries_get_its_size(
    store: IdempotencyStore,
) -> None:
    from idemstore import OutcomeTooLargeError

    idem = Idempotency(SizeLimitedStore(store, limit=1000))
    key = new_key()
    big = Counted(returns(b"x" * 5000))
    result = await idem.run(key, "fp", big)
    assert result.value == b"x" * 5000 and not result.replayed
    # The key remembers the work ran: a retry is told why there is nothing to replay.
    with pytest.raises(OutcomeTooLargeError) as retry:
        await idem.run(key, "fp", big)
    assert (retry.value.size, retry.value.key) == (5000, key)
    assert big.runs == 1


async def blocks_the_loop_past_its_lease() -> bytes:
    await asyncio.sleep(0.15)
    time.sleep(1.5 * BRIEF)  # noqa: ASYNC251 -- blocks the loop: no heartbeat gets through
    await asyncio.sleep(0.15)
    return b"done once"


async def test_a_lapsed_heartbeat_still_completes_when_nobody_took_over(
    store: IdempotencyStore,
) -> None:
    # The work blocks the event loop past its lease (a GC pause, a slow sync call): the next
    # heartbeat finds the lease lapsed, but nobody took the key, so the result must be stored
    # and a retry must replay it rather than run the work again.
    stalls = Counted(blocks_the_loop_past_its_lease)
    idem = Idempotency(store, lease_ttl=BRIEF)
    key = new_key()
    first = await idem.run(key, "fp", stalls)
    second = await idem.run(key, "fp", stalls)
    assert (first.replayed, second.replayed) == (False, True)
    assert second.value == b"done once"
    assert stalls.runs == 1


async def test_a_cancellation_arriving_as_the_work_ends_propagates_and_the_result_is_kept(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store, lease_ttl=5)
    key = new_key()

    async def finishes_as_cancelled() -> bytes:
        me = asyncio.current_task()
        assert me is not None
        # The cancellation lands at the runner's next await that suspends: recording the
        # result. A store that answers inline records it without suspending, so there the
        # cancellation lands at the caller's next await, after run() returned the result.
        asyncio.get_running_loop().call_soon(me.cancel)
        return b"kept"

    returned: list[bytes] = []

    async def run_then_await() -> None:
        returned.append((await idem.run(key, "fp", finishes_as_cancelled)).value)
        await asyncio.sleep(0)

    with pytest.raises(asyncio.CancelledError):
        await run_then_await()
    if returned:
        assert answers_inline(store), "run() returned although its caller was cancelled"
        assert returned == [b"kept"]
    record = await store.wait(key, timeout=5)
    assert record is not None and record.response == b"kept"

    async def must_not_run() -> bytes:
        raise AssertionError("the work ran twice")

    replay = await idem.run(key, "fp", must_not_run)
    assert replay.replayed and replay.value == b"kept"
