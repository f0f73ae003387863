-- idemstore SQLite schema, version 3: recovery points.
--
-- Each record keeps the checkpoints its owners recorded (Execution.checkpoint), as
-- concatenated self-delimiting entries (idemstore.recovery_points), so recording one is an
-- append inside the fenced UPDATE. Existing records get NULL: no checkpoints, read as before.
ALTER TABLE idemstore_records ADD COLUMN checkpoints BLOB;
