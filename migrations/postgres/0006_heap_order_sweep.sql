-- idemstore PostgreSQL schema, version 6: complete as a HOT update.
--
-- complete restarts retention (it rewrites expires_at), and expires_at had an index for the
-- sweeper. An UPDATE that changes an indexed column cannot be a heap-only (HOT) update, so
-- every complete wrote a new entry into both indexes: under 32 concurrent first executions
-- it took 10 to 12 buffer reads and 620 bytes of WAL against a bare UPDATE's 5 and 455, and
-- the store ran at about 0.8 of a bare INSERT + UPDATE's throughput. Without the index, and
-- with room left on each page for the completed version of the rows inserted there, complete
-- is a HOT update: it writes no index entry at all.
--
-- The sweeper now walks the table in physical order, one TID range per batch (PostgreSQL 14
-- and later plan it as a TID Range Scan; older versions run the same statement as a filtered
-- scan from the first page), so one sweep reads the table once instead of an index.
--
-- The CHECK constraints on status and fence go too. PostgreSQL prepares a table's CHECK
-- expressions again for every statement that writes a row, so the two cost each reserve and
-- each complete about 15 us (an INSERT of a record: 45 us with them, 29 us without, same
-- run), half of what each of the store's writes cost beyond a bare INSERT or UPDATE. The only
-- writers are idemstore's statements and functions, which write status as one of the two
-- literals and fence as 1 or one more than the row's.
--
-- The fillfactor applies to pages written from now on; existing pages keep their rows. These
-- statements take the table's ACCESS EXCLUSIVE lock for a moment and rewrite nothing.
--
-- {{schema}} is replaced by the store's quoted schema name before this file runs.

DROP INDEX {{schema}}.idemstore_records_expires_at;

ALTER TABLE {{schema}}.idemstore_records SET (fillfactor = 85);

ALTER TABLE {{schema}}.idemstore_records
    DROP CONSTRAINT idemstore_records_status_check,
    DROP CONSTRAINT idemstore_records_fence_check;
