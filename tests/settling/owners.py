"""How a settling test owns a key: as its one owner, or as a stale owner whose lease lapsed
while a successor on another connection took the key over."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, NamedTuple

from idemstore import ExecutionPolicy, Replay, open_store
from idemstore.testing.stores import WrappedStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import Execution, IdempotencyStore, Lease

FP = "fp"


class FrozenHeartbeat(WrappedStore):
    """``inner`` with a heartbeat that extends nothing: its owner's lease lapses as a paused
    process's would, while the owner goes on as if it held it."""

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        return lease


async def owned(policy: ExecutionPolicy, key: str) -> Execution:
    claim = await policy.begin(key, FP)
    assert not isinstance(claim, Replay)
    return claim


class Takeover(NamedTuple):
    key: str
    stale: Execution
    successor: Execution
    successor_store: IdempotencyStore


@asynccontextmanager
async def taken_over(store_url: str, store: IdempotencyStore, key: str) -> AsyncIterator[Takeover]:
    """``key`` owned by a stale owner (frozen heartbeat, short lease) and then, once that lease
    lapsed, taken over by a waiting successor on a second connection to the same store."""
    stale = await owned(ExecutionPolicy(FrozenHeartbeat(store), lease_ttl=0.5), key)
    async with open_store(store_url) as other:
        successor = await owned(ExecutionPolicy(other, in_flight="wait", lease_ttl=30), key)
        assert successor.takeover
        yield Takeover(key, stale, successor, other)
