"""``idemstore keys`` on PostgreSQL: one statement whose NULL parameters switch filters off."""

from __future__ import annotations

from idemstore.backends.postgres.statements import RECORD_COLUMNS

__all__ = ["RECORDS"]

# Live records (not released, within retention, by the database clock) matching the filters,
# oldest first: $1 the scope, $2 the state ('in_progress', 'stuck', 'completed'), $3 the
# least age in seconds, each NULL for any; $4 the limit. Each state is RecordQuery.matches'
# rule. No index serves it on purpose: the table keeps its primary key alone so that
# complete stays a heap-only update (see schema.sql); an operator's listing pays a
# sequential scan, read-only and lock-free, stopped at the limit. {s}: the schema.
RECORDS = (
    "SELECT scope, key,"
    + RECORD_COLUMNS
    + """
  FROM {s}.idemstore_records
 WHERE NOT released AND expires_at > statement_timestamp()
   AND ($1::text IS NULL OR scope = $1::text)
   AND ($2::text IS NULL
        OR ($2::text = 'completed' AND status = 'completed')
        OR ($2::text = 'in_progress' AND status = 'in_progress'
            AND lease_expires_at > statement_timestamp())
        OR ($2::text = 'stuck' AND status = 'in_progress'
            AND (lease_expires_at IS NULL OR lease_expires_at <= statement_timestamp())))
   AND ($3::float8 IS NULL
        OR created_at <= statement_timestamp() - make_interval(secs => $3::float8))
 ORDER BY created_at
 LIMIT $4"""
)
