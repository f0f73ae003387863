-- idemstore SQLite schema, version 2: a live lease keeps its record alive.
--
-- From this version on, a record in progress never reaches the end of its retention before
-- its lease ends (reserve and extend write expires_at = now + max(retention, lease_ttl)).
-- Records written by earlier code may still hold a live lease past their retention, where a
-- second reserve would take them over and the sweeper delete them: align them once.
UPDATE idemstore_records
   SET expires_at = lease_expires_at
 WHERE status = 'in_progress' AND lease_expires_at > expires_at;
