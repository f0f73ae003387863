-- The live idemstore SQLite schema: what a database holds after every migration in this
-- folder, written once, for reading. Migrations are the history; this file is the present.
-- tests/test_schema_file.py builds one database from the migrations and one from this file
-- and fails on any difference (sqlite_master with comments and spacing ignored, and the
-- PRAGMA views of every table and index), so a new migration updates it too.
--
-- Fresh installs still run the migrations, which record each file in the runner's versions
-- table `idemstore_migrations` (not listed here); this file is never run by idemstore.
--
-- Times are UNIX epoch seconds (REAL) from the client's clock.


-- == The records table ======================================================================

-- One row per (scope, key). A released record stays as a tombstone (status 'released') so the
-- next acquisition continues its fence; reads treat it, and any row past expires_at, as
-- absent. An ordinary rowid table rather than WITHOUT ROWID: responses can be large, and
-- SQLite keeps large values better in rowid tables.
CREATE TABLE idemstore_records (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('in_progress', 'completed', 'released')),
    token            TEXT    NOT NULL,
    fence            INTEGER NOT NULL CHECK (fence >= 1),
    -- 1 when the current lease was won by taking over an expired one: reserve's RETURNING
    -- can only see the row as written, so the update records what it replaced.
    takeover         INTEGER NOT NULL DEFAULT 0,
    response         BLOB,
    created_at       REAL    NOT NULL,
    -- Retention deadline. A record in progress never reaches it before its lease ends:
    -- reserve and extend write expires_at = now + max(retention, lease_ttl).
    expires_at       REAL    NOT NULL,
    lease_expires_at REAL,
    -- Recovery points (Execution.checkpoint): concatenated entries, NULL for none. Kept by a
    -- takeover and by completion; a fresh acquisition (after release or retention) clears them.
    checkpoints      BLOB,
    UNIQUE (scope, key)
);

-- The sweeper deletes in expires_at order, in bounded batches.
CREATE INDEX idemstore_records_expires_at ON idemstore_records (expires_at);
