"""Which ``reserve`` statement the PostgreSQL store sends first, and what a row of one means.

A fresh claim is cheapest as a plain ``INSERT`` (``statements.RESERVE``); a replay is cheapest
as one statement that inserts or reads (``statements.RESERVE_KNOWN``), where the plain
``INSERT`` would need a second round trip to read the row it found. The store cannot know
which a call is before asking, but it knows the keys it has seen exist: ``KnownKeys``
remembers the row ids of its recent claims and answers, and a reserve of one of those sends
the combined statement. The guess only picks a statement; every statement answers correctly
for every state of the row.
"""

from __future__ import annotations

from typing import Any

from idemstore.checkpoints import decode_checkpoints
from idemstore.protocol import Record, Status

__all__ = ["KNOWN_KEYS", "KnownKeys", "record_from_row"]

# Row ids remembered per store: about 100 bytes each, so some 400 KiB at most. A retry
# usually follows its first call within seconds, and a store sees fewer new keys in that time.
KNOWN_KEYS = 4096


class KnownKeys:
    """The row ids of the last ``limit`` keys this store claimed or answered (first in, first
    out). Only a hint: a key may be gone from the table (swept, deleted) and still be here."""

    __slots__ = ("_ids", "_limit")

    def __init__(self, limit: int = KNOWN_KEYS) -> None:
        self._ids: dict[bytes, None] = {}
        self._limit = limit

    def __contains__(self, row_id: bytes) -> bool:
        return row_id in self._ids

    def add(self, row_id: bytes) -> None:
        ids = self._ids
        if row_id in ids:
            return
        ids[row_id] = None
        if len(ids) > self._limit:
            del ids[next(iter(ids))]


def record_from_row(scope: str, key: str, row: Any) -> Record:
    """The record a row of ``RECORD_COLUMNS`` (and the reserve statements' answers) describes."""
    return Record(
        scope=scope,
        key=key,
        fingerprint=row["fingerprint"],
        status=Status(row["status"]),
        token=row["token"],
        fence=row["fence"],
        response=row["response"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        lease_expires_at=row["lease_expires_at"],
        checkpoints=decode_checkpoints(row["checkpoints"]),
    )
