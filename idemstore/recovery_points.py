"""Recovery points of work in several steps: their limits, their stored form, and what an
``Execution`` keeps of them.

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

import struct
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from idemstore.errors import ConfigurationError, LeaseLostError
from idemstore.protocol import Checkpoint, offers

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = [
    "MAX_CHECKPOINTS",
    "MAX_CHECKPOINT_DATA",
    "MAX_CHECKPOINT_NAME",
    "CheckpointsInTransaction",
    "RecoveryPoints",
    "check_checkpoint",
    "decode_checkpoints",
    "encode_checkpoint",
]

# Small enough that a record with all of them and a large response still fits one DynamoDB
# item (400 KB): 32 x (4 x 100 + 1024) bytes is under 46 KB.
MAX_CHECKPOINT_NAME = 100
"""Longest checkpoint name, in characters."""
MAX_CHECKPOINT_DATA = 1024
"""Largest ``data`` of one checkpoint, in bytes: a pointer to the step's result, not it."""
MAX_CHECKPOINTS = 32
"""Most checkpoints one key's record holds."""

# One entry: name length (2 bytes), data length (4 bytes), name (UTF-8), data. Entries are
# self-delimiting, so an engine appends one by concatenating bytes (SQL ``||``, a Lua string)
# and never has to parse what is stored.
_HEADER = struct.Struct(">HI")


def check_checkpoint(name: object, data: object) -> bytes:
    """``data`` as bytes, after checking ``name`` and ``data`` against the limits; raises
    ``TypeError``/``ValueError`` naming what is wrong."""
    if not isinstance(name, str):
        raise TypeError(f"checkpoint name must be a str, not {type(name).__name__}")
    if not name or len(name) > MAX_CHECKPOINT_NAME:
        raise ValueError(
            f"checkpoint name must be 1 to {MAX_CHECKPOINT_NAME} characters, not {len(name)}"
        )
    if "\x00" in name:
        raise ValueError("checkpoint name must not contain NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("checkpoint name must not contain lone surrogates") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"checkpoint data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_CHECKPOINT_DATA:
        raise ValueError(
            f"checkpoint data is {len(data)} bytes; at most {MAX_CHECKPOINT_DATA} are kept:"
            " record where the step's result is (an id), not the result"
        )
    return data


def encode_checkpoint(name: str, data: bytes) -> bytes:
    """The stored form of one checkpoint; a record's checkpoints are these, concatenated."""
    encoded = name.encode("utf-8")
    return _HEADER.pack(len(encoded), len(data)) + encoded + data


def decode_checkpoints(stored: bytes | None) -> tuple[Checkpoint, ...]:
    """The checkpoints of concatenated ``encode_checkpoint`` entries (``None``: none)."""
    if not stored:
        return ()
    view = memoryview(stored)
    found: list[Checkpoint] = []
    at = 0
    while at < len(view):
        name_length, data_length = _HEADER.unpack_from(view, at)
        at += _HEADER.size
        name = bytes(view[at : at + name_length]).decode("utf-8")
        at += name_length
        found.append(Checkpoint(name, bytes(view[at : at + data_length])))
        at += data_length
    return tuple(found)


@runtime_checkable
class CheckpointsInTransaction(Protocol):
    """A store whose checkpoint can run inside a transaction of the caller's connection."""

    async def check_connection(self, connection: object) -> None: ...

    async def checkpoint_within(
        self, connection: object, lease: Lease, name: str, data: bytes
    ) -> bool:
        """``checkpoint``'s fenced statement on ``connection``, in its open transaction:
        ``False`` when the fence no longer holds."""
        ...


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
