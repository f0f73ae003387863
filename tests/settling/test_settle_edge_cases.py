"""Issue 42, case 4: ``settle(connection=...)`` in a savepoint rolled back under an outer
commit, in a read-only transaction, and a ``release()`` after a rolled-back settle."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ConfigurationError, ExecutionPolicy, Status
from idemstore.execution.refusals import refusal_of
from tests.settling.owners import owned

if TYPE_CHECKING:
    from idemstore import Execution, IdempotencyStore
    from tests.settling.business import Business


def new_key() -> str:
    return f"edge-{uuid.uuid4().hex[:12]}"


async def test_a_settle_in_a_savepoint_rolled_back_under_an_outer_commit_is_not_settled(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store, lease_ttl=0.5)
    connection = business.connection
    async with await owned(policy, new_key()) as execution:
        await business.begin()
        if business.engine == "postgres":
            savepoint = connection.transaction()
            await savepoint.start()
            await execution.settle(b"charged", connection=connection)
            await savepoint.rollback()
        else:
            await connection.execute("SAVEPOINT settle")
            await execution.settle(b"charged", connection=connection)
            await connection.execute("ROLLBACK TO settle")
        await business.commit()
    record = await store.get(execution.key)
    assert record is not None and record.status is Status.IN_PROGRESS
    # The state says what the store holds: nothing recorded, the key held until it lapses.
    assert not execution.settled
    assert execution.finished


async def settle_then_roll_back(execution: Execution, business: Business) -> None:
    async with execution:
        try:
            await execution.settle(b"charged", connection=business.connection)
        finally:
            await business.rollback()


async def test_a_settle_in_a_read_only_transaction_is_refused_as_no_retry_can_fix(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store)
    execution = await owned(policy, new_key())
    await business.begin_read_only()
    with pytest.raises(ConfigurationError, match="read-only") as refused:
        await settle_then_roll_back(execution, business)
    # Not a retryable refusal (a 503 that no retry could get past): a configuration error.
    assert refusal_of(refused.value) is None
    assert await store.get(execution.key) is None  # released by the failure policy


async def test_a_release_after_a_rolled_back_settle_outside_the_block_gives_the_key_up(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store)
    execution = await owned(policy, new_key())
    await business.begin()
    await business.charge(execution.key)
    await execution.settle(b"charged", connection=business.connection)
    await business.rollback()
    await execution.release()
    assert execution.finished and not execution.settled
    assert await store.get(execution.key) is None
    again = await owned(policy, execution.key)
    assert not again.takeover
    await again.release()


async def test_a_release_after_a_committed_settle_leaves_the_outcome(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store)
    execution = await owned(policy, new_key())
    await business.begin()
    await execution.settle(b"charged", connection=business.connection)
    await business.commit()
    await execution.release()  # fenced: the completed record is untouchable
    record = await store.get(execution.key)
    assert record is not None and record.status is Status.COMPLETED
