"""``forget``: an operator removes one record after a bug, on any store, and says so in the log.

``delete`` is the store's blunt tool (whatever the state). ``forget`` is the operator's: it
reads the record first, refuses one whose lease is still running unless told to
(``force=True``: the holder then runs on without a record, and its ``complete`` will find
nothing to write), removes it, and logs who removed what and when at WARNING on the
``idemstore.admin`` logger, with the record's fields as ``extra``.

It removes only the record it read. A lease (stuck, or running and forced) is given up with
the store's fenced ``release``, which refuses once another caller took the key over: a blind
``delete`` there would remove the new owner's record while its work runs, and the next retry
would run the work a second time.
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import socket
import time
from typing import TYPE_CHECKING

from idemstore.errors import InProgressError, RecordChangedError
from idemstore.protocol import Lease, Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore, Record

__all__ = ["ADMIN_LOGGER", "forget", "operator_name"]

ADMIN_LOGGER = "idemstore.admin"
logger = logging.getLogger(ADMIN_LOGGER)


def operator_name() -> str:
    """Who is at the keyboard, as the log line names them: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's anonymous uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def running_lease(record: Record, now: float) -> bool:
    """Whether ``record`` is held by a lease that has not reached its deadline at ``now``."""
    lease_end = record.lease_expires_at
    return record.status is Status.IN_PROGRESS and lease_end is not None and lease_end > now


async def forget(
    store: IdempotencyStore,
    key: str,
    *,
    scope: str = "",
    force: bool = False,
    fence: int | None = None,
    who: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Record | None:
    """Remove the live record of ``(scope, key)``; return it (``None``: there was none).

    Raises ``InProgressError`` (carrying the record) when a lease holds the key and has not
    reached its deadline by ``clock`` (this process's; a lease within the engine's clock skew
    of its deadline counts as running), unless ``force``. A stuck lease (past its deadline,
    no outcome) is forgotten without ``force``. The removal is logged at WARNING on
    ``idemstore.admin``: ``who`` (default ``user@host``), the identity, the state and the
    fence.

    Raises ``RecordChangedError`` (carrying the record there now), removing nothing, when the
    record is not the one ``fence`` names (the one an operator was shown), or when another
    caller takes the key over between this read and the removal. A completed record is
    deleted: only at the end of its retention can a new owner take its key, and a removal
    that reaches the store within that instant still removes the new record.
    """
    record = await store.get(key, scope=scope)
    if record is None:
        return None
    if fence is not None and record.fence != fence:
        raise RecordChangedError(
            f"key {key!r} in scope {scope!r} has changed since it was read (fence {fence},"
            f" now {record.fence}): nothing was removed",
            key=key,
            scope=scope,
            record=record,
        )
    if running_lease(record, clock()) and not force:
        raise InProgressError(
            f"key {key!r} in scope {scope!r} is held by a running lease (fence {record.fence},"
            f" until {_when(record.lease_expires_at)}): wait for it, or force the removal"
            " (idemstore forget --force) if its owner is known to be gone",
            key=key,
            scope=scope,
            record=record,
        )
    removed = await _remove(store, record)
    by = who or operator_name()
    logger.warning(
        "idempotency record forgotten by %s: key %r in scope %r (%s, fence %d)%s",
        by,
        key,
        scope,
        record.status.value,
        record.fence,
        "" if removed else "; it had already gone",
        extra={
            "idemstore_operator": by,
            "idemstore_key": key,
            "idemstore_scope": scope,
            "idemstore_status": record.status.value,
            "idemstore_fence": record.fence,
            "idemstore_forced": force,
            "idemstore_at": _when(clock()),
        },
    )
    return record


async def _remove(store: IdempotencyStore, record: Record) -> bool:
    """Remove ``record`` itself, never a record a new owner wrote after it was read."""
    if record.status is not Status.IN_PROGRESS:
        return await store.delete(record.key, scope=record.scope)
    lease = Lease(
        record.scope,
        record.key,
        record.token,
        record.fence,
        record.lease_expires_at or 0.0,
        record.expires_at - record.created_at,
    )
    if await store.release(lease):
        return True
    now = await store.get(record.key, scope=record.scope)
    if now is None:  # released, completed and expired, or deleted meanwhile: gone either way
        return False
    raise RecordChangedError(
        f"key {record.key!r} in scope {record.scope!r} changed after it was read (then: a lease,"
        f" fence {record.fence}; now: {now.status.value}, fence {now.fence}): nothing was removed",
        key=record.key,
        scope=record.scope,
        record=now,
    )


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")
