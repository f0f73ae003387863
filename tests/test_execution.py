"""The execution path (idemstore.execution) on real engines: what every consumer relies on."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import (
    ConfigurationError,
    ConflictError,
    Execution,
    ExecutionPolicy,
    InProgressError,
    Outcome,
    Replay,
    open_store,
)
from idemstore.testing.work import raises, returns

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

# The engines the consumers run on in production, plus the in-process one.
BACKENDS = {
    "memory": "memory_store_url",
    "sqlite": "sqlite_file_store_url",
    "redis": "redis_store_url",
    "postgres": "postgres_store_url",
}


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest) -> AsyncIterator[IdempotencyStore]:
    url = request.getfixturevalue(BACKENDS[request.param])
    async with open_store(url) as opened:
        yield opened


def new_key() -> str:
    return f"exec-{uuid.uuid4().hex[:12]}"


async def test_concurrent_begins_give_exactly_one_execution(store: IdempotencyStore) -> None:
    policy = ExecutionPolicy(store, in_flight="reject")
    key = new_key()
    runs = 0

    async def caller() -> str:
        nonlocal runs
        try:
            claim = await policy.begin(key, "fp")
        except InProgressError:
            return "rejected"
        if isinstance(claim, Replay):
            return "replayed"
        async with claim:
            runs += 1
            await asyncio.sleep(0.2)
            await claim.settle(b"once")
        return "executed"

    outcomes = await asyncio.gather(*(caller() for _ in range(20)))
    assert runs == 1
    assert outcomes.count("executed") == 1
    claim = await policy.begin(key, "fp")
    assert isinstance(claim, Replay) and claim.response == b"once"


async def test_other_fingerprint_is_a_conflict(store: IdempotencyStore) -> None:
    policy = ExecutionPolicy(store)
    key = new_key()
    await policy.run(key, "fp", returns(b"first"))
    with pytest.raises(ConflictError):
        await policy.begin(key, "other")


async def test_a_failure_after_settlement_keeps_the_outcome(store: IdempotencyStore) -> None:
    # Early settlement: the outcome is final once recorded; work that goes on afterwards (an
    # HTTP background task) and fails is not the request's failure.
    policy = ExecutionPolicy(store)
    key = new_key()
    claim = await policy.begin(key, "fp")
    assert isinstance(claim, Execution)

    async def responds_then_fails() -> None:
        async with claim:
            assert await claim.settle(b"sent") is True
            raise RuntimeError("background work failed")

    with pytest.raises(RuntimeError, match="background"):
        await responds_then_fails()
    replay = await policy.begin(key, "fp")
    assert isinstance(replay, Replay) and replay.response == b"sent"


async def test_a_detached_execution_keeps_its_lease_until_settled(
    store: IdempotencyStore,
) -> None:
    # The MCP proxy's SEP-3182 case: the client stopped waiting, the server still executes;
    # no retry may start a second execution, however long that takes.
    # A lease long enough for a loaded machine to beat in time; the checks span three of them.
    policy = ExecutionPolicy(store, lease_ttl=1.0, in_flight="reject")
    key = new_key()
    held: list[Execution] = []
    begun = asyncio.Event()

    async def begins_and_stops_waiting() -> None:
        claim = await policy.begin(key, "fp")
        assert isinstance(claim, Execution)
        held.append(claim)
        begun.set()
        await asyncio.sleep(3600)

    waiter = asyncio.create_task(begins_and_stops_waiting())
    await begun.wait()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    for _ in range(3):  # three lease lengths
        await asyncio.sleep(1.0)
        with pytest.raises(InProgressError):
            await policy.begin(key, "fp")
    assert await held[0].settle(b"the server answered") is True
    replay = await policy.begin(key, "fp")
    assert isinstance(replay, Replay) and replay.response == b"the server answered"


async def test_leaving_the_block_without_settling_releases_the_key(
    store: IdempotencyStore,
) -> None:
    policy = ExecutionPolicy(store, in_flight="reject")
    key = new_key()
    claim = await policy.begin(key, "fp")
    assert isinstance(claim, Execution)
    async with claim:
        pass  # the consumer decided not to record (a 5xx, a streamed response)
    assert claim.finished and not claim.settled
    again = await policy.begin(key, "fp")
    assert isinstance(again, Execution) and again.fence > claim.fence
    await again.release()


async def test_replay_policy_records_errors_and_releases_on_cancellation(
    store: IdempotencyStore,
) -> None:
    def encode(error: Exception) -> bytes | None:
        return f"error: {error}".encode() if isinstance(error, ValueError) else None

    policy = ExecutionPolicy(store, on_failure=encode)
    key = new_key()

    with pytest.raises(ValueError, match="card declined"):
        await policy.run(key, "fp", raises(ValueError("card declined")))
    replay = await policy.begin(key, "fp")
    assert isinstance(replay, Replay) and replay.response == b"error: card declined"

    # An error the encoder declines, and a cancellation, release the key.
    other = new_key()

    with pytest.raises(KeyError):
        await policy.run(other, "fp", raises(KeyError("bug")))
    started = asyncio.Event()

    async def forever() -> bytes:
        started.set()
        await asyncio.sleep(3600)
        return b"never"

    cancelled = new_key()
    task = asyncio.create_task(policy.run(cancelled, "fp", forever))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for released in (other, cancelled):
        reservation = await store.reserve(released, "fp", lease_ttl=5, retention=5)
        assert reservation.outcome is Outcome.ACQUIRED


async def test_an_execution_settles_once(store: IdempotencyStore) -> None:
    policy = ExecutionPolicy(store)
    claim = await policy.begin(new_key(), "fp")
    assert isinstance(claim, Execution)
    await claim.settle(b"one")
    with pytest.raises(RuntimeError, match="already settled"):
        await claim.settle(b"two")
    with pytest.raises(RuntimeError, match="already settled"):
        await claim.release()


async def test_hold_policy_keeps_the_key_after_a_failure(store: IdempotencyStore) -> None:
    policy = ExecutionPolicy(store, lease_ttl=0.5, on_failure="hold", in_flight="reject")
    key = new_key()

    with pytest.raises(RuntimeError):
        await policy.run(
            key, "fp", raises(RuntimeError("unknown whether the side effect happened"))
        )
    with pytest.raises(InProgressError):
        await policy.begin(key, "fp")


def test_bad_policies_are_configuration_errors() -> None:
    store: IdempotencyStore = object()  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match="in_flight"):
        ExecutionPolicy(store, in_flight="queue")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_failure"):
        ExecutionPolicy(store, on_failure="retry")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        ExecutionPolicy(store, lease_ttl=0)


async def test_an_encoder_that_fails_releases_the_key(store: IdempotencyStore) -> None:
    def broken(error: Exception) -> bytes | None:
        return str(error)  # type: ignore[return-value]  # not bytes

    policy = ExecutionPolicy(store, on_failure=broken, in_flight="reject")
    key = new_key()

    with pytest.raises(ValueError, match="declined"):
        await policy.run(key, "fp", raises(ValueError("declined")))
    again = await policy.begin(key, "fp")
    assert isinstance(again, Execution)
    await again.release()
