-- The records table of the SQLite backend (idemstore/backends/sqlite.py).
--
-- Times are UNIX epoch seconds (REAL) from the client's clock. A released record stays as a
-- tombstone (status 'released') so the next acquisition continues its fence; reads treat it,
-- and any row past expires_at, as absent. An ordinary rowid table rather than WITHOUT ROWID:
-- responses can be large, and SQLite keeps large values better in rowid tables.
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
    expires_at       REAL    NOT NULL,
    lease_expires_at REAL,
    UNIQUE (scope, key)
);

-- sweep deletes in expires_at order, in bounded batches.
CREATE INDEX idemstore_records_expires_at ON idemstore_records (expires_at);
