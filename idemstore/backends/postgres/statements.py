"""The SQL of the PostgreSQL backend and the small pure helpers around it.

Statements are templates: ``{s}`` is the store's quoted schema. The functions they call are
installed by ``migrations/postgres``.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "APPLIED_MIGRATIONS",
    "CHECKPOINT",
    "COMPLETE",
    "CONNECTION_PARAMETERS",
    "CREATE_VERSIONS_TABLE",
    "DELETE",
    "EXTEND",
    "GET",
    "HEAP_PAGES",
    "MAX_SECONDS",
    "RELEASE",
    "RESERVE",
    "RESERVE_KNOWN",
    "RESERVE_READ",
    "RESERVE_TAKEOVER",
    "SCHEMA_NAME",
    "SWEEP_BATCH",
    "WATCH",
    "hash64",
    "lock_keys",
    "quote_ident",
    "record_id",
    "seconds",
]

# Durations past this many seconds (about 100 years) are clamped: PostgreSQL's timestamps end
# in the year 294276 and an overflowing interval would be an error, not "forever".
MAX_SECONDS = 3.2e9

# A schema name we can quote safely and that fits PostgreSQL's 63-byte identifiers.
SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# libpq-style connection parameters asyncpg understands; every other query parameter is ours.
CONNECTION_PARAMETERS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "dbname",
        "database",
        "passfile",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "application_name",
    }
)

RECORD_COLUMNS = """
    fingerprint, status, token, fence, response,
    extract(epoch FROM created_at)::float8 AS created_at,
    extract(epoch FROM expires_at)::float8 AS expires_at,
    CASE WHEN status = 'in_progress'
         THEN extract(epoch FROM lease_expires_at)::float8 END AS lease_expires_at,
    checkpoints"""

# {s} is the quoted schema.

# reserve sends one of two first statements (reserving.KnownKeys picks): RESERVE for a key
# this store has not seen exist, RESERVE_KNOWN for one it has.
#
# RESERVE: the first claim of an absent key (the common case) as a plain INSERT, the same work
# a hand-written "insert if absent" does: the primary key arbitrates racing first claims (a
# loser waits for the winner's commit and inserts nothing), and a conflict writes nothing. One
# clock reading serves the whole row, so the lease never ends after the retention (reserve's
# retention is at least the lease). $7 is record_id(scope, key), the digest the function
# computes, so both find the same row. A claim returns only what a lease holds (fence, lease
# deadline). When it returns no row, RESERVE_READ reads the row it found.
RESERVE = """
INSERT INTO {s}.idemstore_records
       (id, scope, key, fingerprint, status, released, token, fence, response,
        created_at, expires_at, lease_expires_at)
SELECT $7::bytea, $1, $2, $3, 'in_progress', false, $4, 1, NULL,
       now, now + make_interval(secs => $6), now + make_interval(secs => $5)
  FROM (SELECT clock_timestamp() AS now) AS clock
ON CONFLICT (id) DO NOTHING
RETURNING fence, extract(epoch FROM lease_expires_at)::float8 AS lease_expires_at"""

# The answer to a reserve from a live record it may not take (a replay, a duplicate of running
# work, a mismatch), with idemstore_reserve's own conditions, from a plain read: a replay
# writes nothing and runs no PL/pgSQL. A row that may be taken (lapsed lease, released, past
# retention) or is gone gives no answer: then RESERVE_TAKEOVER decides under the key's advisory
# lock. $FP is the request's fingerprint, $ID the row id.
_ANSWER_COLUMNS = (
    """CASE WHEN fingerprint <> $FP THEN 'mismatch'
            WHEN status = 'completed' THEN 'completed'
            ELSE 'in_progress' END AS outcome,"""
    + RECORD_COLUMNS
)
_ANSWERED = """id = $ID::bytea AND NOT released AND expires_at > clock.now
   AND (fingerprint <> $FP OR status = 'completed' OR lease_expires_at > clock.now)"""

# RESERVE_READ: reserve's second statement after RESERVE found the key. A claim that waited on a
# racing first claim reads that row here, committed.
RESERVE_READ = (
    (
        "\nSELECT "
        + _ANSWER_COLUMNS
        + "\n  FROM {s}.idemstore_records, (SELECT clock_timestamp() AS now) AS clock\n WHERE "
        + _ANSWERED
    )
    .replace("$FP", "$2")
    .replace("$ID", "$1")
)

# RESERVE_KNOWN: RESERVE's INSERT and, when the key exists, RESERVE_READ's read in one
# statement, so a replay is one round trip. Not the default: under concurrency the read beside
# the INSERT cost every fresh claim about 30 us of server CPU, though a fresh claim never runs
# it (docs/benchmarks.md, PostgreSQL). The read sees the statement's snapshot: when the INSERT
# lost to a first claim that committed while it waited, it answers nothing, and
# RESERVE_TAKEOVER looks again. Same parameters as RESERVE.
RESERVE_KNOWN = (
    (
        """
WITH clock AS (SELECT clock_timestamp() AS now),
claimed AS (
    INSERT INTO {s}.idemstore_records
           (id, scope, key, fingerprint, status, released, token, fence, response,
            created_at, expires_at, lease_expires_at)
    SELECT $7::bytea, $1, $2, $3, 'in_progress', false, $4, 1, NULL,
           now, now + make_interval(secs => $6), now + make_interval(secs => $5)
      FROM clock
    ON CONFLICT (id) DO NOTHING
    RETURNING fence, lease_expires_at)
SELECT 'acquired'::text AS outcome, NULL::text AS fingerprint, NULL::text AS status,
       NULL::text AS token, fence, NULL::bytea AS response,
       NULL::float8 AS created_at, NULL::float8 AS expires_at,
       extract(epoch FROM lease_expires_at)::float8 AS lease_expires_at,
       NULL::bytea AS checkpoints
  FROM claimed
UNION ALL
SELECT """
        + _ANSWER_COLUMNS
        + """
  FROM {s}.idemstore_records, clock
 WHERE NOT EXISTS (SELECT FROM claimed)
   AND """
        + _ANSWERED
    )
    .replace("$FP", "$3")
    .replace("$ID", "$7")
)

# reserve's last statement, when RESERVE_READ or RESERVE_KNOWN answered nothing:
# idemstore_reserve takes the key over, claims it again if it is gone, or answers the row a
# racing takeover left. In FROM, so the function runs once for all its columns.
RESERVE_TAKEOVER = "SELECT * FROM {s}.idemstore_reserve($1::bigint, $2, $3, $4, $5, $6, $7)"

# complete: the UPDATE of idemstore_complete as one plain statement (no PL/pgSQL call, no CTE:
# a bare UPDATE costs the server less), with its conditions unchanged: the holder's token and
# fence, still in progress, not released, within retention, re-checked on the newest row
# version after a concurrent takeover. The NOTIFY is sent (at commit) only for a watched row,
# as before: the CASE guards the call. One row (true) when the holder completed, none when
# not. The SET touches no indexed column, so on a page with room this is a HOT update
# (migration 0006). $1 is record_id(scope, key).
COMPLETE = """
UPDATE {s}.idemstore_records
   SET status = 'completed',
       response = $4,
       lease_expires_at = NULL,
       expires_at = clock_timestamp() + make_interval(secs => $5)
 WHERE id = $1::bytea
   AND token = $2 AND fence = $3
   AND status = 'in_progress' AND NOT released
   AND expires_at > clock_timestamp()
RETURNING CASE WHEN watched THEN pg_notify($6, $7::bigint::text) IS NOT NULL ELSE true END"""
RELEASE = "SELECT {s}.idemstore_release($1, $2, $3, $4, $5, $6)"
DELETE = "SELECT {s}.idemstore_delete($1, $2, $3, $4)"
CHECKPOINT = "SELECT {s}.idemstore_checkpoint($1, $2, $3, $4, $5)"

# extend: the holder check of complete, plus "the lease has not lapsed": extending a lapsed
# lease would let its holder keep a key others were already entitled to take. Re-evaluated on
# the newest row after a concurrent takeover commits, so a fenced-out holder extends nothing.
# Retention restarts with the heartbeat ($6 is at least the lease): a live lease keeps its row.
EXTEND = """
UPDATE {s}.idemstore_records
   SET lease_expires_at = clock_timestamp() + make_interval(secs => $5),
       expires_at = clock_timestamp() + make_interval(secs => $6)
 WHERE id = {s}.idemstore_id($1, $2) AND token = $3 AND fence = $4
   AND status = 'in_progress' AND NOT released
   AND expires_at > clock_timestamp() AND lease_expires_at > clock_timestamp()
RETURNING extract(epoch FROM lease_expires_at)::float8"""

# get/wait: released rows and rows past retention do not exist for any read, swept or not.
# ``now`` is the database clock, so ``wait`` can tell when a lease lapses by the same clock.
GET = (
    "SELECT"
    + RECORD_COLUMNS
    + """,
    extract(epoch FROM clock_timestamp())::float8 AS now
  FROM {s}.idemstore_records
 WHERE id = {s}.idemstore_id($1, $2) AND NOT released AND expires_at > clock_timestamp()"""
)

# wait's read: GET's columns, after marking a record in progress watched (migration 0003), so
# that its complete or release notifies; a record nobody waits on is never notified about.
WATCH = "SELECT * FROM {s}.idemstore_watch($1, $2)"

# sweep, one bounded batch per statement (so one short transaction each), over the TID range
# [$2, $3) of the table: there is no index on expires_at (it would make every complete a
# non-HOT update), so batches walk the heap in physical order, one chunk of pages at a time
# (idemstore.backends.postgres.sweeping). SKIP LOCKED: a batch never waits for a row that a
# reserve is taking over or another sweeper is deleting. The deadline is checked again on the
# row actually deleted. Returns how many went.
SWEEP_BATCH = """
WITH gone AS (
    DELETE FROM {s}.idemstore_records
     WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM {s}.idemstore_records
              WHERE ctid >= $2::tid AND ctid < $3::tid
                AND expires_at <= clock_timestamp()
              LIMIT $1
                FOR UPDATE SKIP LOCKED))
       AND expires_at <= clock_timestamp()
    RETURNING 1)
SELECT count(*) FROM gone"""

# How many pages the records table has now, for the sweep's chunks: read through a row's
# tableoid, so no name goes into a string literal. No row (an empty table): nothing to sweep.
HEAP_PAGES = """
SELECT pg_relation_size(tableoid) / current_setting('block_size')::bigint
  FROM {s}.idemstore_records LIMIT 1"""

APPLIED_MIGRATIONS = """
SELECT name, checksum, extract(epoch FROM applied_at)::float8
  FROM {s}.idemstore_migrations ORDER BY name"""

CREATE_VERSIONS_TABLE = """
CREATE TABLE IF NOT EXISTS {s}.idemstore_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def hash64(*parts: str) -> int:
    """A signed 64-bit hash of ``parts``, each length-prefixed so parts never run together."""
    digest = hashlib.blake2b(digest_size=8, person=b"idemstore")
    for part in parts:
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(4, "big"))
        digest.update(data)
    return int.from_bytes(digest.digest(), "big", signed=True)


def lock_keys(first: str) -> Callable[[str, str], int]:
    """``hash64(first, scope, key)`` as a function of ``(scope, key)``: the hash of ``first``
    is taken once and copied per call, which roughly halves the cost of the lock key every
    reserve and complete computes."""
    seeded = hashlib.blake2b(digest_size=8, person=b"idemstore")
    data = first.encode("utf-8")
    seeded.update(len(data).to_bytes(4, "big") + data)

    def lock_key(scope: str, key: str) -> int:
        digest = seeded.copy()
        scope_data, key_data = scope.encode("utf-8"), key.encode("utf-8")
        digest.update(
            len(scope_data).to_bytes(4, "big")
            + scope_data
            + len(key_data).to_bytes(4, "big")
            + key_data
        )
        return int.from_bytes(digest.digest(), "big", signed=True)

    return lock_key


def record_id(scope: str, key: str) -> bytes:
    """The row id of (scope, key), as ``idemstore_id`` computes it: SHA-256 of the UTF-8 scope,
    NUL, the UTF-8 key. Computed here for the plain statements, which saves the server the
    digest; the functions compute the same bytes, so both paths find the same row."""
    return hashlib.sha256(scope.encode() + b"\x00" + key.encode()).digest()


def seconds(value: float) -> float:
    return min(value, MAX_SECONDS)
