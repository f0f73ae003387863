"""Recovery points on a store without the optional capability, and the stored form."""

from __future__ import annotations

from typing import Any

import pytest

from idemstore import Checkpoint, ConfigurationError, Execution, ExecutionPolicy
from idemstore.backends.memory import MemoryStore
from idemstore.recovery_points import decode_checkpoints, encode_checkpoint


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


def test_stored_entries_concatenate_into_the_checkpoints_in_order() -> None:
    stored = b"".join(
        encode_checkpoint(name, data) for name, data in [("a", b""), ("é", b"\x00\xff" * 3)]
    )
    assert decode_checkpoints(stored) == (Checkpoint("a", b""), Checkpoint("é", b"\x00\xff" * 3))
    assert decode_checkpoints(None) == decode_checkpoints(b"") == ()
