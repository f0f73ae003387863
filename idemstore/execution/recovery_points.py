"""Recovery points of work in several steps: what an ``Execution`` keeps of them, and how it
records one (their limits and stored form: ``idemstore.checkpoints``).

The owner of a key records each finished step with ``await execution.checkpoint(name,
data)``; the store appends it to the key's record, fenced like ``complete`` (a stale owner's
checkpoint is refused with ``LeaseLostError``). An owner that takes the key over reads
``execution.checkpoints`` and resumes after the last one. Completion keeps them (replays,
``get`` and ``idemstore inspect`` show them); acquiring the key afresh (after a release or
past retention) starts with none.

On the SQL engines ``checkpoint(name, data, connection=conn)`` runs the same fenced statement
on the caller's connection, inside the caller's open transaction, so a step's business writes
and its checkpoint commit together or not at all. The execution cannot see that transaction
end: it lists the checkpoint at once (optimistically), so a caller that rolls the step back
and goes on in the same execution must run that step again (its checkpoint too); the usual
path, letting the failure leave the execution's block, ends the execution, and whoever takes
the key over reads only what committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from idemstore.checkpoints import MAX_CHECKPOINTS, check_checkpoint
from idemstore.errors import ConfigurationError, LeaseLostError
from idemstore.protocol import Checkpoint, CheckpointsInTransaction, offers

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["RecoveryPoints"]


class RecoveryPoints:
    """The checkpoints an ``Execution`` knows of: those its key had when it was taken over,
    then those this owner recorded."""

    __slots__ = ("_recorded", "_store")

    def __init__(self, store: IdempotencyStore, taken_over: tuple[Checkpoint, ...]) -> None:
        self._store = store
        self._recorded = taken_over

    @property
    def recorded(self) -> tuple[Checkpoint, ...]:
        return self._recorded

    async def record(
        self, lease: Lease, name: str, data: bytes, *, finished: bool, connection: object = None
    ) -> None:
        """Append ``Checkpoint(name, data)`` to the key's record (through ``connection``, in
        its open transaction, when given), or raise."""
        data = check_checkpoint(name, data)
        if finished:
            raise RuntimeError(f"execution of key {lease.key!r} is finished: nothing to record")
        if len(self._recorded) >= MAX_CHECKPOINTS:
            raise ValueError(
                f"key {lease.key!r} already holds {MAX_CHECKPOINTS} checkpoints, the most kept:"
                " checkpoint whole steps, not every item of a loop"
            )
        if connection is not None:
            done = await self._record_within(connection, lease, name, data)
        else:
            checkpoint = getattr(self._store, "checkpoint", None)
            if checkpoint is None:
                raise ConfigurationError(
                    f"this store ({type(self._store).__name__}) does not support checkpoints:"
                    " use a store with a `checkpoint` method (every store idemstore ships has one)"
                )
            done = await checkpoint(lease, name, data)
        if not done:
            raise LeaseLostError(
                f"checkpoint {name!r} of key {lease.key!r} was refused: the lease (fence"
                f" {lease.fence}) was lost to a takeover; stop"
                + (", roll your transaction back" if connection is not None else "")
                + ": the new owner resumes the work",
                key=lease.key,
                scope=lease.scope,
                record=None,
            )
        self._recorded = (*self._recorded, Checkpoint(name, data))

    async def _record_within(
        self, connection: object, lease: Lease, name: str, data: bytes
    ) -> bool:
        if not offers(self._store, CheckpointsInTransaction):
            raise ConfigurationError(
                "checkpoint(name, data, connection=...) records the step inside your database "
                "transaction, so the store must live in that database (postgresql:// or "
                f"sqlite://); a {type(self._store).__name__} keeps its records elsewhere. Commit"
                " your transaction, then call checkpoint(name, data) without a connection"
            )
        store = cast("CheckpointsInTransaction", self._store)
        # Refused before anything is written: a connection of another engine or database, or
        # without an open transaction.
        await store.check_connection(connection)
        return await store.checkpoint_within(connection, lease, name, data)
