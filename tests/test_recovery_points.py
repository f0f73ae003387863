"""Recovery points on a store without the optional capability, and the stored form."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idemstore import Checkpoint, ConfigurationError, Execution, ExecutionPolicy, LeaseLostError
from idemstore.backends.memory import MemoryStore
from idemstore.checkpoints import decode_checkpoints, encode_checkpoint


class _WithoutCheckpoints:
    """A store of an outside author written before recovery points: no ``checkpoint``."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "checkpoint":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_store_without_checkpoints_runs_work_but_refuses_a_checkpoint_clearly() -> None:
    policy = ExecutionPolicy(_WithoutCheckpoints(MemoryStore()))  # type: ignore[arg-type]
    claim = await policy.begin("k", "fp")
    assert isinstance(claim, Execution)
    async with claim:
        assert claim.checkpoints == ()
        with pytest.raises(ConfigurationError, match="does not support checkpoints"):
            await claim.checkpoint("step")
        assert await claim.settle(b"done") is True


async def test_a_finished_execution_refuses_a_checkpoint() -> None:
    claim = await ExecutionPolicy(MemoryStore()).begin("k", "fp")
    assert isinstance(claim, Execution)
    await claim.settle(b"done")
    with pytest.raises(RuntimeError, match="finished"):
        await claim.checkpoint("late")


class _DeadOwnerThenLateTakeover(MemoryStore):
    """Heartbeats extend nothing (the owner as good as dead); the first reply granting a
    takeover comes after its lease has lapsed."""

    late = True

    async def extend(self, lease: Any, *, lease_ttl: float) -> Any:
        return lease

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        reservation = await super().reserve(*args, **kwargs)
        if reservation.takeover and self.late:
            self.late = False
            await asyncio.sleep(0.3)
        return reservation


async def test_a_takeover_granted_too_late_leaves_the_checkpoints_to_the_next_owner() -> None:
    store = _DeadOwnerThenLateTakeover()
    policy = ExecutionPolicy(store, lease_ttl=0.1, in_flight="wait")
    first = await policy.begin("k", "fp")
    assert isinstance(first, Execution)
    await first.checkpoint("step-1")
    with pytest.raises(LeaseLostError, match="not started"):
        await policy.begin("k", "fp")
    # Given up without a release: a release would drop the step its first owner committed.
    then = await policy.begin("k", "fp")
    assert isinstance(then, Execution) and then.takeover
    assert then.checkpoints == (Checkpoint("step-1", b""),)
    await then.settle(b"done")


def test_stored_entries_concatenate_into_the_checkpoints_in_order() -> None:
    stored = b"".join(
        encode_checkpoint(name, data) for name, data in [("a", b""), ("é", b"\x00\xff" * 3)]
    )
    assert decode_checkpoints(stored) == (Checkpoint("a", b""), Checkpoint("é", b"\x00\xff" * 3))
    assert decode_checkpoints(None) == decode_checkpoints(b"") == ()
