"""Recovery points (``checkpoint``), on every store that offers them: order, fencing,
takeover, completion, limits; and a three-step workflow through the runner that resumes
after its owner was killed mid-way."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from idemstore import ExecutionPolicy, IdempotencyStore, LeaseLostError, Outcome, Status
from idemstore.checkpoints import MAX_CHECKPOINT_DATA, MAX_CHECKPOINT_NAME, MAX_CHECKPOINTS
from idemstore.execution import Execution, current_execution
from idemstore.protocol import Checkpoint, CheckpointingStore, Lease, offers
from idemstore.testing.contract.test_store_contract import (
    BRIEF,
    FP,
    LONG,
    SHORT,
    SLACK,
    new_key,
)
from idemstore.testing.stores import WrappedStore


@pytest.fixture
def checkpointing(store: IdempotencyStore) -> CheckpointingStore:
    if not offers(store, CheckpointingStore):
        pytest.skip("this store does not support checkpoints (an optional capability)")
    return cast("CheckpointingStore", store)


async def acquire(store: IdempotencyStore, key: str, *, lease_ttl: float = LONG) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED
    assert reservation.lease is not None
    return reservation.lease


async def holding_checkpoint_one(
    checkpointing: CheckpointingStore, *, lease_ttl: float = LONG, retention: float = LONG
) -> Lease:
    """A lease on a fresh key that recorded the checkpoint ("one", b"1")."""
    reservation = await checkpointing.reserve(
        new_key(), FP, lease_ttl=lease_ttl, retention=retention
    )
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    assert await checkpointing.checkpoint(reservation.lease, "one", b"1") is True
    return reservation.lease


async def stored_checkpoints(store: IdempotencyStore, key: str) -> tuple[Checkpoint, ...]:
    """The checkpoints of ``key``'s record, which must exist."""
    record = await store.get(key)
    assert record is not None
    return record.checkpoints


async def test_checkpoints_are_kept_in_the_order_recorded(
    checkpointing: CheckpointingStore,
) -> None:
    key = new_key()
    lease = await acquire(checkpointing, key)
    assert await checkpointing.checkpoint(lease, "charged", b"ch_1") is True
    assert await checkpointing.checkpoint(lease, "shipped", b"") is True
    assert await checkpointing.checkpoint(lease, "charged", b"\x00\xff") is True
    assert await stored_checkpoints(checkpointing, key) == (
        Checkpoint("charged", b"ch_1"),
        Checkpoint("shipped", b""),
        Checkpoint("charged", b"\x00\xff"),
    )


async def test_a_record_without_checkpoints_has_none(checkpointing: CheckpointingStore) -> None:
    key = new_key()
    await acquire(checkpointing, key)
    assert await stored_checkpoints(checkpointing, key) == ()


async def test_stale_owner_cannot_checkpoint_after_takeover(
    checkpointing: CheckpointingStore,
) -> None:
    stale = await holding_checkpoint_one(checkpointing, lease_ttl=BRIEF)
    await asyncio.sleep(BRIEF + SLACK)
    taken = await checkpointing.reserve(stale.key, FP, lease_ttl=LONG, retention=LONG)
    assert taken.takeover is True
    assert await checkpointing.checkpoint(stale, "two", b"2") is False
    assert await stored_checkpoints(checkpointing, stale.key) == (Checkpoint("one", b"1"),)


async def test_takeover_hands_over_the_checkpoints(checkpointing: CheckpointingStore) -> None:
    key = new_key()
    first = await acquire(checkpointing, key, lease_ttl=BRIEF)
    assert await checkpointing.checkpoint(first, "one", b"1") is True
    assert await checkpointing.checkpoint(first, "two", b"2") is True
    await asyncio.sleep(BRIEF + SLACK)
    taken = await checkpointing.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert taken.outcome is Outcome.ACQUIRED and taken.takeover is True
    assert taken.checkpoints == (Checkpoint("one", b"1"), Checkpoint("two", b"2"))
    assert taken.lease is not None
    assert await checkpointing.checkpoint(taken.lease, "three", b"3") is True
    assert [c.name for c in await stored_checkpoints(checkpointing, key)] == ["one", "two", "three"]


async def test_completion_keeps_the_checkpoints_for_replays(
    checkpointing: CheckpointingStore,
) -> None:
    lease = await holding_checkpoint_one(checkpointing)
    assert await checkpointing.complete(lease, b"done") is True
    replay = await checkpointing.reserve(lease.key, FP, lease_ttl=LONG, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None
    assert replay.record.status is Status.COMPLETED
    assert replay.record.checkpoints == (Checkpoint("one", b"1"),)
    assert await checkpointing.checkpoint(lease, "late", b"") is False


async def starts_without_checkpoints(checkpointing: CheckpointingStore, key: str) -> None:
    """``key``, acquired again as a fresh key (no takeover), has no checkpoints."""
    again = await checkpointing.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.ACQUIRED and again.takeover is False
    assert again.checkpoints == ()
    assert await stored_checkpoints(checkpointing, key) == ()


async def test_a_key_acquired_again_after_release_starts_without_checkpoints(
    checkpointing: CheckpointingStore,
) -> None:
    lease = await holding_checkpoint_one(checkpointing)
    assert await checkpointing.release(lease) is True
    await starts_without_checkpoints(checkpointing, lease.key)


async def test_a_key_acquired_again_past_retention_starts_without_checkpoints(
    checkpointing: CheckpointingStore,
) -> None:
    lease = await holding_checkpoint_one(checkpointing, lease_ttl=BRIEF, retention=SHORT)
    assert await checkpointing.complete(lease, b"done", retention=SHORT) is True
    await asyncio.sleep(SHORT + SLACK)
    await starts_without_checkpoints(checkpointing, lease.key)


async def test_checkpoint_names_and_data_past_the_limits_are_refused(
    checkpointing: CheckpointingStore,
) -> None:
    lease = await acquire(checkpointing, new_key())
    with pytest.raises(ValueError, match="checkpoint name"):
        await checkpointing.checkpoint(lease, "", b"")
    with pytest.raises(ValueError, match="checkpoint name"):
        await checkpointing.checkpoint(lease, "n" * (MAX_CHECKPOINT_NAME + 1), b"")
    with pytest.raises(ValueError, match="NUL"):
        await checkpointing.checkpoint(lease, "a\x00b", b"")
    with pytest.raises(TypeError, match="checkpoint data must be bytes"):
        await checkpointing.checkpoint(lease, "one", "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="checkpoint data"):
        await checkpointing.checkpoint(lease, "one", b"x" * (MAX_CHECKPOINT_DATA + 1))
    # At the limits, accepted and read back whole.
    name = "é" * MAX_CHECKPOINT_NAME
    data = b"\xff" * MAX_CHECKPOINT_DATA
    assert await checkpointing.checkpoint(lease, name, data) is True
    assert await stored_checkpoints(checkpointing, lease.key) == (Checkpoint(name, data),)


async def test_an_execution_refuses_checkpoints_past_the_most_kept(
    checkpointing: CheckpointingStore,
) -> None:
    policy = ExecutionPolicy(checkpointing, lease_ttl=LONG, retention=LONG)
    claim = await policy.begin(new_key(), FP)
    assert isinstance(claim, Execution)
    async with claim:
        for step in range(MAX_CHECKPOINTS):
            await claim.checkpoint(f"step-{step}")
        with pytest.raises(ValueError, match=f"already holds {MAX_CHECKPOINTS} checkpoints"):
            await claim.checkpoint("one-too-many")
        await claim.settle(b"ok")


async def test_a_workflow_resumes_after_the_last_checkpoint_of_a_killed_owner(
    checkpointing: CheckpointingStore,
) -> None:
    """Three steps; the first owner is cancelled inside step two (after step one's
    checkpoint) and its lease lapses; the taker runs steps two and three only."""
    policy = ExecutionPolicy(checkpointing, lease_ttl=BRIEF, retention=LONG, on_failure="hold")
    key = new_key()
    ran: list[str] = []
    inside_step_two = asyncio.Event()

    async def workflow() -> bytes:
        execution = current_execution()
        assert execution is not None
        done = [c.name for c in execution.checkpoints]
        for step in ("reserve-stock", "charge", "ship"):
            if step in done:
                continue
            ran.append(step)
            if step == "charge" and not execution.takeover:
                inside_step_two.set()
                await asyncio.Event().wait()  # killed here
            await execution.checkpoint(step, f"{step}-result".encode())
        return b",".join(c.data for c in execution.checkpoints)

    first = asyncio.create_task(policy.run(key, FP, workflow))
    await inside_step_two.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.sleep(BRIEF + SLACK)  # "hold": the key frees itself when it lapses
    result = await policy.run(key, FP, workflow)
    assert result.takeover is True
    assert ran == ["reserve-stock", "charge", "charge", "ship"]
    assert result.value == b"reserve-stock-result,charge-result,ship-result"
    assert [c.name for c in await stored_checkpoints(checkpointing, key)] == [
        "reserve-stock",
        "charge",
        "ship",
    ]


class _Paused(WrappedStore):
    """The store, but an owner's heartbeats never reach it (a paused process)."""

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        return lease


async def test_a_stale_owner_checkpoint_raises_lease_lost(
    checkpointing: CheckpointingStore,
) -> None:
    policy = ExecutionPolicy(checkpointing, lease_ttl=LONG, retention=LONG)
    key = new_key()
    # A paused owner: its heartbeats never reach the store, so its lease lapses.
    paused = ExecutionPolicy(_Paused(checkpointing), lease_ttl=BRIEF, retention=LONG)
    stale = await paused.begin(key, FP)
    assert isinstance(stale, Execution)
    await asyncio.sleep(BRIEF + SLACK)
    taker = await policy.begin(key, FP)
    assert isinstance(taker, Execution) and taker.takeover
    with pytest.raises(LeaseLostError, match="lost to a takeover"):
        await stale.checkpoint("step")
    await taker.settle(b"ok")
