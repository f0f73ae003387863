"""The SQL of the SQLite backend: the statements every operation runs, the migration runner's
own statements, and the decoding of a row into a ``Record``."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from idemstore.checkpoints import decode_checkpoints
from idemstore.errors import SchemaError
from idemstore.protocol import Record, Status

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.backends.migrate import Migration
    from idemstore.protocol import Lease

__all__ = [
    "CHECKPOINT",
    "COMPLETE",
    "CREATE_VERSIONS",
    "DELETE",
    "EXTEND",
    "INSERT_VERSION",
    "RELEASE",
    "RESERVE",
    "SELECT_ROW",
    "SELECT_VERSIONS",
    "SELECT_VISIBLE",
    "SWEEP",
    "VERSIONS_EXISTS",
    "decode_record",
    "holder_params",
    "live_record",
    "split_statements",
    "statements_of",
]

COLUMNS = (
    "scope, key, fingerprint, status, token, fence, response, "
    "created_at, expires_at, lease_expires_at, checkpoints"
)

# One statement decides reserve. It inserts a first record, or overwrites the existing row only
# when the key is free for the caller:
# - expires_at <= :now: past retention, the record is gone for every read, so a new one starts
#   (continuing the fence, which must keep rising for as long as any trace of the key is kept);
# - status = 'released': a tombstone, the holder gave the key up;
# - in progress with an expired lease and the SAME fingerprint: a takeover. A different
#   fingerprint never takes over (that is a mismatch, whatever the lease).
# Otherwise the row is left alone, RETURNING yields nothing and the caller reads the row in the
# same transaction, under the same write lock, so what it reports is what blocked it.
# Checkpoints survive only a takeover (the new owner resumes the work); any other acquisition
# starts the work afresh, so it must not see a former execution's steps.
RESERVE = """
INSERT INTO idemstore_records (
    scope, key, fingerprint, status, token, fence, takeover, response,
    created_at, expires_at, lease_expires_at
) VALUES (
    :scope, :key, :fingerprint, 'in_progress', :token, 1, 0, NULL,
    :now, :now + :held, :now + :lease_ttl
)
ON CONFLICT (scope, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = 'in_progress',
    token = excluded.token,
    fence = idemstore_records.fence + 1,
    takeover = (idemstore_records.status = 'in_progress'
                AND idemstore_records.expires_at > :now),
    checkpoints = CASE WHEN idemstore_records.status = 'in_progress'
                            AND idemstore_records.expires_at > :now
                       THEN idemstore_records.checkpoints END,
    response = NULL,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at,
    lease_expires_at = excluded.lease_expires_at
WHERE idemstore_records.expires_at <= :now
   OR idemstore_records.status = 'released'
   OR (idemstore_records.status = 'in_progress'
       AND idemstore_records.lease_expires_at <= :now
       AND idemstore_records.fingerprint = excluded.fingerprint)
RETURNING fence, takeover, lease_expires_at, checkpoints
"""

SELECT_ROW = f"SELECT {COLUMNS} FROM idemstore_records WHERE scope = ? AND key = ?"

# Reads never see a tombstone. Nor a record past retention, swept or not: that is judged in
# Python by a clock read once the row is in hand (live_record), not by a time bound here, because a
# read may wait (busy database, queued connection) and a time taken before it would be stale.
SELECT_VISIBLE = (
    f"SELECT {COLUMNS} FROM idemstore_records WHERE scope = ? AND key = ? AND status != 'released'"
)

# The owner check complete/release/extend share: token AND fence (the fence is what orders
# owners; a lease whose fence was superseded must fail even if it presents a valid token), still
# in progress (a completed or released record has no owner any more), and not past retention
# (such a record is gone for every read even before the sweeper removes it). The lease deadline
# is deliberately not checked: a lapsed lease nobody took over may still complete.
HOLDER = (
    "scope = :scope AND key = :key AND token = :token AND fence = :fence "
    "AND status = 'in_progress' AND expires_at > :now"
)

COMPLETE = f"""
UPDATE idemstore_records
SET status = 'completed', response = :response, lease_expires_at = NULL,
    expires_at = :now + :retention
WHERE {HOLDER}
RETURNING fence
"""

# The row stays as a tombstone so the next acquisition's fence is higher than this one.
RELEASE = f"""
UPDATE idemstore_records
SET status = 'released', lease_expires_at = NULL, response = NULL, checkpoints = NULL
WHERE {HOLDER}
RETURNING fence
"""

# A recovery point: appended under the owner check of complete, so a fenced-out owner's step
# is never recorded. Entries are self-delimiting: appending is concatenation. `||` yields
# TEXT (bytes unchanged in a UTF-8 database, the only encoding idemstore creates): cast back.
CHECKPOINT = f"""
UPDATE idemstore_records
SET checkpoints = CAST(coalesce(checkpoints, X'') || :entry AS BLOB)
WHERE {HOLDER}
RETURNING fence
"""

# A lapsed lease is lost even if nobody has taken it over yet: extending it would let a holder
# keep a key others were already entitled to. Retention restarts with the heartbeat and never
# ends before the new lease deadline: a live lease keeps its record.
EXTEND = f"""
UPDATE idemstore_records
SET lease_expires_at = :now + :lease_ttl, expires_at = :now + :held
WHERE {HOLDER} AND lease_expires_at > :now
RETURNING lease_expires_at
"""

DELETE = "DELETE FROM idemstore_records WHERE scope = ? AND key = ? RETURNING status, expires_at"

SWEEP = """
DELETE FROM idemstore_records WHERE rowid IN (
    SELECT rowid FROM idemstore_records WHERE expires_at <= ? LIMIT ?
)
RETURNING 1
"""

VERSIONS_EXISTS = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idemstore_migrations'"
)
SELECT_VERSIONS = "SELECT name, checksum, applied_at FROM idemstore_migrations ORDER BY name"
CREATE_VERSIONS = """CREATE TABLE IF NOT EXISTS idemstore_migrations (
    name       TEXT PRIMARY KEY,
    checksum   TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""
# applied_at from SQLite's clock, so the dry run can show the exact statement.
INSERT_VERSION = (
    "INSERT INTO idemstore_migrations (name, checksum, applied_at) "
    "VALUES ('{name}', '{checksum}', (julianday('now') - 2440587.5) * 86400.0)"
)


def split_statements(sql: str) -> list[str]:
    """The statements of a SQL script, each ending with ``;`` (comments kept with them).

    ``sqlite3.complete_statement`` decides where a statement ends, so semicolons inside
    strings, comments and ``CREATE TRIGGER ... BEGIN ... END`` bodies do not split it.
    """
    statements: list[str] = []
    start = 0
    for index, char in enumerate(sql):
        if char == ";" and sqlite3.complete_statement(sql[start : index + 1]):
            statements.append(sql[start : index + 1].strip())
            start = index + 1
    rest = "\n".join(line for line in sql[start:].splitlines() if not line.strip().startswith("--"))
    if rest.strip():
        raise SchemaError(f"SQL script ends with an unterminated statement: {rest.strip()!r}")
    return statements


def statements_of(migration: Migration) -> list[str]:
    """What applying ``migration`` executes inside its transaction, in order."""
    return [
        CREATE_VERSIONS,
        *split_statements(migration.sql),
        INSERT_VERSION.format(name=migration.name, checksum=migration.checksum),
    ]


def live_record(rows: Sequence[Sequence[Any]], now: float) -> Record | None:
    """The record of a ``SELECT_VISIBLE`` result, unless it is past retention at ``now``."""
    if not rows or rows[0][8] <= now:
        return None
    return decode_record(rows[0])


def decode_record(row: Sequence[Any]) -> Record:
    status = Status(row[3])
    return Record(
        scope=row[0],
        key=row[1],
        fingerprint=row[2],
        status=status,
        token=row[4],
        fence=row[5],
        response=bytes(row[6]) if status is Status.COMPLETED and row[6] is not None else None,
        created_at=row[7],
        expires_at=row[8],
        lease_expires_at=row[9] if status is Status.IN_PROGRESS else None,
        checkpoints=decode_checkpoints(row[10]),
    )


def holder_params(lease: Lease, now: float) -> dict[str, Any]:
    """The named parameters that fence a holder's statement (``COMPLETE``, ``CHECKPOINT``,
    ``RELEASE``, ``EXTEND``) to ``lease``, at ``now``."""
    return {
        "scope": lease.scope,
        "key": lease.key,
        "token": lease.token,
        "fence": lease.fence,
        "now": now,
    }
