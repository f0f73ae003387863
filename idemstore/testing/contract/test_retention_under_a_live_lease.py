"""A live lease keeps its record alive, however it was extended (issue 13, case 1).

Retention counts from the holder's last reserve or extend and never ends before the lease;
``complete`` restarts it. So a retention shorter than the lease, or heartbeats that carry the
work past the retention, never free a key that someone still holds.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from idemstore import Idempotency, Outcome, Status

if TYPE_CHECKING:
    from idemstore import IdempotencyStore, Lease

FP = "fp-a"
SHORT = 0.3
SLACK = 0.25
LONG = 60.0


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


async def hold(store: IdempotencyStore, key: str, *, lease_ttl: float, retention: float) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=retention)
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    return reservation.lease


async def test_a_retention_shorter_than_the_lease_does_not_free_the_key(
    store: IdempotencyStore,
) -> None:
    key = new_key()
    lease = await hold(store, key, lease_ttl=LONG, retention=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    record = await store.get(key)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.fence == lease.fence
    second = await store.reserve(key, FP, lease_ttl=LONG, retention=SHORT)
    assert second.outcome is Outcome.IN_PROGRESS
    assert second.record is not None and second.record.token == lease.token
    assert await store.extend(lease, lease_ttl=LONG) is not None
    assert await store.complete(lease, b"once") is True


async def test_sweep_never_removes_a_record_whose_lease_is_live(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await hold(store, key, lease_ttl=LONG, retention=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    await store.sweep(limit=1_000_000)
    record = await store.get(key)
    assert record is not None and record.token == lease.token
    assert await store.release(lease) is True


async def test_heartbeats_carry_a_record_past_its_retention(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await hold(store, key, lease_ttl=0.5, retention=0.7)
    loop = asyncio.get_running_loop()
    until = loop.time() + 1.6
    while loop.time() < until:
        await asyncio.sleep(0.15)
        extended = await store.extend(lease, lease_ttl=0.5)
        assert extended is not None, "a live lease was reported lost"
        lease = extended
        second = await store.reserve(key, FP, lease_ttl=0.5, retention=0.7)
        assert second.outcome is Outcome.IN_PROGRESS, "a second reserve acquired a held key"
    assert await store.complete(lease, b"done") is True
    replay = await store.reserve(key, FP, lease_ttl=0.5, retention=0.7)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None and replay.record.fence == lease.fence


async def test_completion_restarts_retention_from_the_completion(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await hold(store, key, lease_ttl=LONG, retention=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    assert await store.complete(lease, b"kept") is True
    assert (await store.get(key)) is not None
    await asyncio.sleep(SHORT + SLACK)
    assert await store.get(key) is None
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.ACQUIRED and again.lease is not None
    # Fences never repeat while a trace of the key is kept; once it is gone a new record may
    # start over, but never below a lease the store still knows of.
    assert again.lease.fence >= 1


async def test_heartbeated_work_past_retention_runs_exactly_once_among_racing_callers(
    store: IdempotencyStore,
) -> None:
    """Lease 2 s, retention 1 s, 3.5 s of work kept alive by the runner's heartbeats, while
    other callers keep asking for the same key: the work runs once and everyone gets it."""
    # A beat every 0.67 s leaves 1.3 s for an extend to land. With a 1-s lease (0.67 s of
    # slack) the beats were late once in a few CI runs on DynamoDB (moto serving one request
    # at a time; three test lanes on two cores), and a waiter took the lapsed lease over.
    key = new_key()
    runner = Idempotency(store, lease_ttl=2.0, retention=1.0, in_flight="wait")
    executions: list[int] = []

    async def work() -> bytes:
        executions.append(1)
        await asyncio.sleep(3.5)
        return b"the one result"

    async def caller(delay: float) -> bytes:
        await asyncio.sleep(delay)
        result = await runner.run(key, FP, work)
        return result.value

    values = await asyncio.gather(*(caller(0.2 * i) for i in range(8)))
    assert len(executions) == 1
    assert values == [b"the one result"] * 8
