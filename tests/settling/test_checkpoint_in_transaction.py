"""Issue 29: ``checkpoint(name, data, connection=conn)`` records a recovery point inside the
caller's own transaction, on Postgres and SQLite: a step's business write and its checkpoint
commit together or not at all, a stale owner is fenced out before its writes commit, and a
connection that cannot carry the checkpoint is refused before anything is written.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import (
    Checkpoint,
    ExecutionPolicy,
    LeaseLostError,
)
from tests.settling.owners import owned

if TYPE_CHECKING:
    from idemstore import IdempotencyStore
    from tests.settling.business import Business
    from tests.settling.owners import Takeover


def new_key() -> str:
    return f"step-{uuid.uuid4().hex[:12]}"


async def stored_checkpoints(store: IdempotencyStore, key: str) -> tuple[Checkpoint, ...]:
    record = await store.get(key)
    assert record is not None
    return record.checkpoints


async def test_a_step_row_and_its_checkpoint_commit_together(
    store: IdempotencyStore, business: Business
) -> None:
    key = new_key()
    async with await owned(ExecutionPolicy(store), key) as execution:
        await business.begin()
        await business.charge(f"{key}/one")
        await execution.checkpoint("one", b"row 1", connection=business.connection)
        await business.commit()
        assert execution.checkpoints == (Checkpoint("one", b"row 1"),)
        assert await stored_checkpoints(store, key) == (Checkpoint("one", b"row 1"),)
        await execution.settle(b"done")
    assert await business.charges() == {f"{key}/one": 1}


async def test_a_rolled_back_step_leaves_neither_its_row_nor_its_checkpoint(
    store: IdempotencyStore, business: Business
) -> None:
    key = new_key()
    execution = await owned(ExecutionPolicy(store), key)
    await execution.checkpoint("zero")
    await business.begin()
    await business.charge(f"{key}/one")
    await execution.checkpoint("one", connection=business.connection)
    await business.rollback()
    assert await stored_checkpoints(store, key) == (Checkpoint("zero", b""),)
    assert await business.charges() == {}
    # Documented: the execution listed the rolled-back step at once; it runs the step again.
    assert [c.name for c in execution.checkpoints] == ["zero", "one"]
    await execution.release()


async def test_a_stale_owner_gets_lease_lost_and_its_step_rolls_back(
    takeover: Takeover, business: Business
) -> None:
    key, stale, successor, other = takeover
    await business.begin()
    await business.charge(f"{key}/one")
    with pytest.raises(LeaseLostError, match="roll your transaction back"):
        await stale.checkpoint("one", connection=business.connection)
    await business.rollback()
    assert await business.charges() == {}
    assert await stored_checkpoints(other, key) == ()
    await successor.release()
    await stale.release()  # fenced: nothing happens to the successor's key
