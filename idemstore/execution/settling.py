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

from typing import TYPE_CHECKING, cast

from idemstore.errors import ConfigurationError, LeaseLostError
from idemstore.execution import outcome_markers
from idemstore.protocol import SettlesInTransaction, offers
from idemstore.records import check_response

if TYPE_CHECKING:
    from idemstore.execution.state_machine import Execution
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["in_transaction_store", "settle_within"]


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
    """``execution.settle(response, connection=connection)``: see ``Execution.settle``.

    Drives the execution through its named transitions only: ``check_running``,
    ``start_committing`` (which the end of its ``async with`` block completes) and
    ``fenced_out``."""
    response = check_response(response)
    execution.check_running()
    policy = execution.policy
    store = in_transaction_store(policy.store)
    # Refusals come before anything changes: the execution stays running and owns its key.
    await store.check_connection(connection)
    lease = await execution.start_committing()
    limit = policy.max_response_bytes
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
    if not await store.complete_within(connection, lease, recorded, policy.retention):
        # Nothing more to do with a key another owner holds: the execution is over, unsettled,
        # whether the caller catches the error or not.
        await execution.fenced_out()
        raise _lost(lease)
    return stored


def _lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(
        f"the lease on idempotency key {lease.key!r} (fence {lease.fence}) was lost: another "
        "caller took the key over, so this outcome was not recorded. Roll your transaction "
        "back: its writes must not commit",
        key=lease.key,
        scope=lease.scope,
        record=None,
    )
