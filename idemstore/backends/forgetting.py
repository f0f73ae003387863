"""``forget``: an operator removes one record after a bug, on any store, and says so in the log.

``delete`` is the store's blunt tool (whatever the state). ``forget`` is the operator's: it
reads the record first, refuses one whose lease is still running unless told to
(``force=True``: the holder then runs on without a record, and its ``complete`` will find
nothing to write), deletes it, and logs who removed what and when at WARNING on the
``idemstore.admin`` logger, with the record's fields as ``extra``.
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import socket
import time
from typing import TYPE_CHECKING

from idemstore.errors import InProgressError
from idemstore.protocol import Status

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
    who: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Record | None:
    """Remove the live record of ``(scope, key)``; return it (``None``: there was none).

    Raises ``InProgressError`` (carrying the record) when a lease holds the key and has not
    reached its deadline by ``clock`` (this process's; a lease within the engine's clock skew
    of its deadline counts as running), unless ``force``. A stuck lease (past its deadline,
    no outcome) is forgotten without ``force``. The removal is logged at WARNING on
    ``idemstore.admin``: ``who`` (default ``user@host``), the identity, the state and the
    fence. Between the read and the delete a new owner may take the key: the delete removes
    whatever is there then, as ``delete`` does.
    """
    record = await store.get(key, scope=scope)
    if record is None:
        return None
    if running_lease(record, clock()) and not force:
        raise InProgressError(
            f"key {key!r} in scope {scope!r} is held by a running lease (fence {record.fence},"
            f" until {_when(record.lease_expires_at)}): wait for it, or force the removal"
            " (idemstore forget --force) if its owner is known to be gone",
            key=key,
            scope=scope,
            record=record,
        )
    removed = await store.delete(key, scope=scope)
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


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")
