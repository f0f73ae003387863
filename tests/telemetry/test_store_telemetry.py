"""Store-level metrics and spans match what a scripted run did, on real engines."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

import idemstore
from idemstore import ConflictError, Idempotency, InProgressError, Sweeper, open_store
from idemstore.backends.memory import MemoryStore
from idemstore.protocol import Outcome, Status
from idemstore.testing import FakeClock

if TYPE_CHECKING:
    from idemstore import IdempotencyStore
    from tests.telemetry.conftest import Telemetry

FINGERPRINT = "f" * 64
OTHER = "e" * 64
LAPSING_TTL = 1.0


async def _scripted_run(store: IdempotencyStore) -> None:
    """11 calls through the runner: 6 executed (one of them a takeover), 3 replays,
    1 conflict, 1 in-progress rejection; plus a holder, reserving directly, whose lease lapses
    and who is then fenced out of complete."""
    runner = Idempotency(store, in_flight="reject")

    async def work() -> bytes:
        return b"done"

    for i in range(5):
        assert not (await runner.run(f"k{i}", FINGERPRINT, work)).replayed
    for i in range(3):
        assert (await runner.run(f"k{i}", FINGERPRINT, work)).replayed
    with pytest.raises(ConflictError):
        await runner.run("k3", OTHER, work)

    # A holder whose lease lapses: the runner takes the key over, the holder is fenced out.
    stale = await store.reserve("held", FINGERPRINT, lease_ttl=LAPSING_TTL, retention=60)
    assert stale.lease is not None
    with pytest.raises(InProgressError):
        await runner.run("held", FINGERPRINT, work)
    await asyncio.sleep(LAPSING_TTL + 0.2)
    assert not (await runner.run("held", FINGERPRINT, work)).replayed
    assert await store.complete(stale.lease, b"late") is False


async def test_reserve_outcomes_count_what_the_scripted_run_did(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    await _scripted_run(store)
    backend = store.backend  # type: ignore[attr-defined]
    outcomes = "idemstore.reserve.outcomes"
    # 5 fresh + 1 stale holder + 1 takeover acquired; 3 replays; 1 mismatch; 1 in progress.
    assert telemetry.total(outcomes, **{"idemstore.reserve.outcome": "acquired"}) == 7
    assert (
        telemetry.total(
            outcomes,
            **{"idemstore.reserve.outcome": "acquired", "idemstore.reserve.takeover": True},
        )
        == 1
    )
    assert telemetry.total(outcomes, **{"idemstore.reserve.outcome": "completed"}) == 3
    assert telemetry.total(outcomes, **{"idemstore.reserve.outcome": "mismatch"}) == 1
    assert telemetry.total(outcomes, **{"idemstore.reserve.outcome": "in_progress"}) == 1
    assert telemetry.total(outcomes, **{"idemstore.backend": backend}) == 12
    assert telemetry.total("idemstore.lease.fenced_out", **{"idemstore.operation": "complete"}) == 1

    # The runner's 11 calls (the stale holder reserved directly), by what the consumer saw.
    calls = "idemstore.consumer.calls"
    assert telemetry.total(calls) == 11
    assert telemetry.totals_by(calls, "idemstore.call.outcome") == {
        "executed": 6,
        "replayed": 3,
        "conflict": 1,
        "in_progress": 1,
    }

    duration = "idemstore.store.operation.duration"
    assert telemetry.total(duration, **{"idemstore.operation": "reserve"}) == 12
    # 6 runs that executed completed, and the stale holder tried.
    assert telemetry.total(duration, **{"idemstore.operation": "complete"}) == 7


async def test_every_store_operation_is_one_span_with_backend_outcome_and_fence(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    await _scripted_run(store)
    reserves = telemetry.spans("idemstore reserve")
    assert len(reserves) == 12
    takeovers = telemetry.spans("idemstore reserve", **{"idemstore.reserve.takeover": True})
    assert len(takeovers) == 1
    assert takeovers[0].attributes["idemstore.outcome"] == Outcome.ACQUIRED.value
    assert takeovers[0].attributes["idemstore.fence"] == 2
    fenced = telemetry.spans("idemstore complete", **{"idemstore.outcome": "fenced_out"})
    assert len(fenced) == 1
    for span in telemetry.spans():
        assert span.attributes["idemstore.backend"] == store.backend  # type: ignore[attr-defined]


async def test_wait_records_its_duration_and_counts_a_timeout(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    held = await store.reserve("w", FINGERPRINT, lease_ttl=30, retention=60)
    assert held.lease is not None
    await store.wait("w", timeout=0.1)
    assert telemetry.total("idemstore.wait.timeouts") == 1

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        assert held.lease is not None
        await store.complete(held.lease, b"ok")

    finisher = asyncio.create_task(finish_soon())
    record = await store.wait("w", timeout=10)
    await finisher
    assert record is not None and record.response == b"ok"
    assert telemetry.total("idemstore.wait.timeouts") == 1
    assert telemetry.total("idemstore.wait.duration", **{"idemstore.wait.outcome": "settled"}) == 1
    assert telemetry.total("idemstore.wait.duration", **{"idemstore.wait.outcome": "timeout"}) == 1


@pytest.mark.parametrize("engine_clock", [1000.0, 1e10], ids=["behind", "ahead"])
async def test_wait_timeouts_follow_the_engines_lease_clock_not_this_machines(
    telemetry: Telemetry, engine_clock: float
) -> None:
    # The engine's clock (the memory store's, here) is far from this machine's wall clock:
    # only the store may say whether a lease still runs.
    clock = FakeClock(engine_clock)
    store = idemstore.telemetry.instrumented(MemoryStore(clock=clock))
    held = await store.reserve("w", FINGERPRINT, lease_ttl=30, retention=60)
    assert held.lease is not None
    record = await store.wait("w", timeout=0.05)  # still held when the timeout runs out
    assert record is not None and record.status is Status.IN_PROGRESS
    assert telemetry.total("idemstore.wait.timeouts") == 1
    clock.advance(31)  # the lease lapsed, by the engine's clock: wait returns at once
    record = await store.wait("w", timeout=5)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert telemetry.total("idemstore.wait.timeouts") == 1
    assert telemetry.total("idemstore.wait.duration", **{"idemstore.wait.outcome": "settled"}) == 1


async def test_sweep_removals_are_counted(store: IdempotencyStore, telemetry: Telemetry) -> None:
    for i in range(3):
        reservation = await store.reserve(f"s{i}", FINGERPRINT, lease_ttl=30, retention=0.1)
        assert reservation.lease is not None
        await store.complete(reservation.lease, b"x", retention=0.1)
    await asyncio.sleep(0.3)
    removed = await store.sweep()
    # Engines that expire records themselves (Redis TTL) may have removed them already.
    assert telemetry.total("idemstore.sweep.removed") == removed


async def test_a_failing_extend_outside_a_heartbeat_is_an_operation_error_only(
    store_url: str, telemetry: Telemetry
) -> None:
    store = open_store(store_url)
    async with store:
        held = await store.reserve("hb", FINGERPRINT, lease_ttl=30, retention=60)
        assert held.lease is not None
    # The store is closed: extend raises instead of answering.
    with pytest.raises(Exception):  # noqa: B017 - whatever the engine raises
        await store.extend(held.lease, lease_ttl=30)
    errors = [s for s in telemetry.spans("idemstore extend") if "error.type" in s.attributes]
    assert len(errors) == 1
    duration = "idemstore.store.operation.duration"
    assert telemetry.total(duration, **{"idemstore.operation": "extend"}) == 1
    # No heartbeat made that call: idemstore.heartbeat.failures counts the LeaseKeeper's.
    assert telemetry.total("idemstore.heartbeat.failures") == 0


async def test_the_sweeper_counts_removals_even_of_a_store_built_directly(
    telemetry: Telemetry,
) -> None:
    clock = FakeClock(1000.0)
    store = MemoryStore(clock=clock)  # built before any wrapping, clock injected
    for i in range(4):
        reservation = await store.reserve(f"s{i}", FINGERPRINT, lease_ttl=30, retention=60)
        assert reservation.lease is not None
        await store.complete(reservation.lease, b"x")
    clock.advance(61)
    assert await Sweeper(store, limit=3).sweep_once() == 4
    assert telemetry.total("idemstore.sweep.removed", **{"idemstore.backend": "memory"}) == 4
    # Two batches (3, then 1): two sweep operations timed.
    duration = "idemstore.store.operation.duration"
    assert telemetry.total(duration, **{"idemstore.operation": "sweep"}) == 2
