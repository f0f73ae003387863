"""Consumer metrics and the consumer span, through the one execution path, on real engines."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

import pytest

import idemstore
from idemstore import ConflictError, Idempotency, InProgressError, LeaseKeeper, open_store
from idemstore.backends.memory import MemoryStore
from idemstore.execution import ExecutionPolicy

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from idemstore import IdempotencyStore
    from tests.telemetry.conftest import Telemetry

FINGERPRINT = "f" * 64
OTHER = "e" * 64
# What ``_ten_calls`` does, by call outcome.
TEN_CALLS = {"executed": 5, "replayed": 3, "conflict": 1, "in_progress": 1}


async def _ten_calls(store: IdempotencyStore) -> None:
    """10 calls: 5 executed, 3 replayed, 1 conflict, 1 rejected while in progress."""
    runner = Idempotency(store, in_flight="reject")

    async def work() -> bytes:
        return b"done"

    for i in range(5):
        await runner.run(f"k{i}", FINGERPRINT, work)
    for i in range(3):
        await runner.run(f"k{i}", FINGERPRINT, work)
    with pytest.raises(ConflictError):
        await runner.run("k3", OTHER, work)
    held = await store.reserve("held", FINGERPRINT, lease_ttl=30, retention=60)
    assert held.acquired
    with pytest.raises(InProgressError):
        await runner.run("held", FINGERPRINT, work)


async def test_consumer_calls_count_each_outcome_of_a_scripted_run(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    await _ten_calls(store)
    calls = "idemstore.consumer.calls"
    assert telemetry.totals_by(calls, "idemstore.consumer") == {"runner": 10}
    assert telemetry.totals_by(calls, "idemstore.call.outcome") == TEN_CALLS


def _children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        s
        for s in telemetry.spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


async def test_store_spans_nest_under_the_consumer_span_and_a_replay_shows(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    await _ten_calls(store)
    outcome = "idemstore.call.outcome"
    spans = telemetry.spans("idemstore runner")
    assert Counter(span.attributes[outcome] for span in spans) == TEN_CALLS
    executed = telemetry.spans("idemstore runner", **{outcome: "executed"})
    replayed = telemetry.spans("idemstore runner", **{outcome: "replayed"})
    for span in executed:
        assert span.attributes["idemstore.outcome"] == "settled"
        assert [c.name for c in _children(telemetry, span)] == [
            "idemstore reserve",
            "idemstore complete",
        ]
    for span in replayed:
        (child,) = _children(telemetry, span)
        assert child.name == "idemstore reserve"
        assert child.attributes["idemstore.outcome"] == "completed"
    # The direct reserve of the holder has no consumer span above it.
    roots = [s for s in telemetry.spans("idemstore reserve") if s.parent is None]
    assert len(roots) == 1


async def test_heartbeats_nest_under_the_consumer_span_of_their_execution(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    policy = ExecutionPolicy(store, lease_ttl=0.3, consumer="heartbeat-test")
    claim = await policy.begin("slow", FINGERPRINT)
    async with claim:  # type: ignore[union-attr]
        await asyncio.sleep(0.5)  # the keeper extends every lease_ttl / 3
        await claim.settle(b"done")  # type: ignore[union-attr]
    (consumer,) = telemetry.spans("idemstore heartbeat-test")
    names = [c.name for c in _children(telemetry, consumer)]
    assert names[0] == "idemstore reserve" and names[-1] == "idemstore complete"
    assert names.count("idemstore extend") >= 1


async def test_a_lost_lease_ends_its_consumer_span_as_not_recorded(
    store: IdempotencyStore, telemetry: Telemetry
) -> None:
    policy = ExecutionPolicy(store, lease_ttl=30)
    claim = await policy.begin("lost", FINGERPRINT)
    await store.delete("lost")  # an operator removed the key: the owner is fenced out
    async with claim:  # type: ignore[union-attr]
        assert not await claim.settle(b"late")  # type: ignore[union-attr]
    (consumer,) = telemetry.spans("idemstore runner")
    assert consumer.attributes["idemstore.outcome"] == "not_recorded"
    assert telemetry.total("idemstore.lease.fenced_out", **{"idemstore.operation": "complete"}) == 1


async def test_a_heartbeat_whose_extend_raises_counts_as_a_store_error(
    telemetry: Telemetry,
) -> None:
    store = open_store("memory://")
    async with store:
        held = await store.reserve("hb", FINGERPRINT, lease_ttl=30, retention=60)
        assert held.lease is not None
    # The store is closed: every beat's extend raises.
    keeper = LeaseKeeper(store, held.lease, lease_ttl=0.3)
    await asyncio.sleep(0.25)  # beats every lease_ttl / 3
    await keeper.stop()
    failures = "idemstore.heartbeat.failures"
    store_errors = {"idemstore.heartbeat.failure": "store_error"}
    assert telemetry.total(failures) == telemetry.total(failures, **store_errors) >= 1
    (point, *_) = telemetry.points(failures)
    assert point.attributes["error.type"] == "RuntimeError"  # a closed MemoryStore says so
    assert point.attributes["idemstore.backend"] == "memory"


async def test_a_heartbeat_that_finds_its_lease_lost_counts_as_lease_lost(
    telemetry: Telemetry,
) -> None:
    policy = ExecutionPolicy(MemoryStore(), lease_ttl=0.3)
    claim = await policy.begin("lost-beat", FINGERPRINT)
    assert not isinstance(claim, idemstore.Replay)
    await policy.store.delete("lost-beat")  # an operator removed the key
    await asyncio.sleep(0.15)  # the first beat (lease_ttl / 3) finds the lease gone
    assert claim.lapsed
    await claim.release()
    failures = "idemstore.heartbeat.failures"
    assert telemetry.total(failures, **{"idemstore.heartbeat.failure": "lease_lost"}) == 1
    assert telemetry.total(failures) == 1
    (point,) = telemetry.points(failures)
    assert "error.type" not in point.attributes
    fenced = {"idemstore.operation": "extend"}
    assert telemetry.total("idemstore.lease.fenced_out", **fenced) == 1


async def test_a_consumer_records_through_a_view_and_the_callers_store_stays_as_given(
    telemetry: Telemetry,
) -> None:
    store = MemoryStore()
    policy = ExecutionPolicy(store, consumer="view-test")

    async def work() -> bytes:
        return b"done"

    await policy.run("v", FINGERPRINT, work)
    await policy.run("v", FINGERPRINT, work)
    assert policy.store is store  # not replaced by a wrapper
    assert len(telemetry.spans("idemstore view-test")) == 2
    assert len(telemetry.spans("idemstore reserve")) == 2
    assert telemetry.total("idemstore.consumer.calls", **{"idemstore.backend": "memory"}) == 2


async def test_after_uninstrument_a_consumer_records_no_more(telemetry: Telemetry) -> None:
    policy = ExecutionPolicy(MemoryStore())

    async def work() -> bytes:
        return b"done"

    await policy.run("u1", FINGERPRINT, work)
    idemstore.uninstrument()
    await policy.run("u2", FINGERPRINT, work)
    assert telemetry.total("idemstore.consumer.calls") == 1
    assert len(telemetry.spans("idemstore reserve")) == 1
