"""Settling a key inside the caller's own database transaction: ``settle(response,
connection=conn)``.

The completion is the store's one fenced statement, run on the caller's connection, so it
commits with the caller's business writes or not at all. A stale owner's statement matches
no row: ``LeaseLostError`` tells the caller to roll back, so its writes never commit, and the
execution is over (finished, not settled: the key is another owner's).

Until the caller's transaction ends, the execution is *committing*: the heartbeat is stopped
(the completed row, locked by the caller's transaction, needs none: no takeover can pass an
uncommitted completion), and the execution does not count as settled. Leaving its ``async
with`` block normally takes the caller's commit as done; leaving it with an exception applies
the policy's ``on_failure`` as if nothing had been settled. Every store call that follows is
fenced, so whichever way the caller's transaction ended, nothing is undone or recorded twice:
a rolled-back completion leaves the key in progress, and the policy releases or holds it
(a hold lapses with the lease, so the key is never owned forever).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from idemstore import outcome_markers
from idemstore.errors import ConfigurationError, LeaseLostError
from idemstore.protocol import offers
from idemstore.records import check_response

if TYPE_CHECKING:
    from idemstore.execution import Execution
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["SettlesInTransaction", "leave_committing", "settle_within"]


@runtime_checkable
class SettlesInTransaction(Protocol):
    """A store whose completion can run inside a transaction of the caller's connection."""

    async def check_connection(self, connection: object) -> None:
        """``ConfigurationError`` unless ``connection`` is this store's engine, reaches the
        store's database, and has a transaction open. Writes nothing."""
        ...

    async def complete_within(
        self, connection: object, lease: Lease, response: bytes, retention: float
    ) -> bool:
        """``complete``'s fenced statement on ``connection`` (checked by ``check_connection``),
        in its open transaction: ``False`` when the fence no longer holds."""
        ...


def in_transaction_store(store: IdempotencyStore) -> SettlesInTransaction:
    """``store`` if it can settle inside a caller's transaction; else why not, and what to do."""
    if offers(store, SettlesInTransaction):
        return cast("SettlesInTransaction", store)
    raise ConfigurationError(
        "settle(response, connection=...) records the outcome inside your database "
        "transaction, so the store must live in that database (postgresql:// or sqlite://); "
        f"a {type(store).__name__} keeps its records elsewhere. Commit your transaction, then "
        "call settle(response) without a connection, and pass the idempotency key on to the "
        "systems your work calls (see docs/transactions.md)"
    )


async def settle_within(execution: Execution, response: bytes, connection: object) -> bool:
    """``execution.settle(response, connection=connection)``: see ``Execution.settle``."""
    response = check_response(response)
    if execution.finished:
        execution._claim("committing")  # raises the RuntimeError that says what it is
    store = in_transaction_store(execution._policy.store)
    # Refusals come before anything changes: the execution stays running and owns its key.
    await store.check_connection(connection)
    execution._claim("committing")
    lease = await execution._keeper.stop()
    limit = execution._policy.max_response_bytes
    stored = True
    if limit is not None and len(response) > limit:
        # The work's effects commit with the caller's transaction: record that the outcome was
        # too large, in that same transaction, rather than let a retry run it again.
        why = f"the response is {len(response)} bytes; max_response_bytes is {limit}"
        recorded = outcome_markers.too_large(len(response), limit, why)
        stored = False
    else:
        recorded = outcome_markers.escape(response)
    # Not shielded like the other bookkeeping: the statement belongs to the caller's
    # connection, which the caller rolls back if it is cancelled.
    if not await store.complete_within(connection, lease, recorded, execution._policy.retention):
        # Nothing more to do with a key another owner holds: the execution is over, unsettled,
        # whether the caller catches the error or not.
        execution._state = "released"
        if execution._observation is not None:
            await execution._observation.finishing("released", _recorded(False))
        raise _lost(lease)
    return stored


async def _recorded(done: bool) -> bool:
    return done


def _lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(
        f"the lease on idempotency key {lease.key!r} (fence {lease.fence}) was lost: another "
        "caller took the key over, so this outcome was not recorded. Roll your transaction "
        "back: its writes must not commit",
        key=lease.key,
        scope=lease.scope,
        record=None,
    )


async def leave_committing(execution: Execution, exc: BaseException | None) -> None:
    """The end of the ``async with`` block of an execution settled through a connection."""
    if exc is None:
        # The caller committed (or, having swallowed its rollback, holds the key until the
        # stopped lease lapses): nothing more to write. An observer sees the settlement now
        # that it is final (a failure is observed as whatever the policy does instead).
        execution._state = "settled"
        if execution._observation is not None:
            await execution._observation.finishing("settled", _recorded(True))
        return
    # The caller's transaction rolled back, or something failed after it committed: the policy
    # applies as to any failure, and its fenced calls find a completed record untouchable.
    execution._state = "running"
    await execution.fail(exc)
