"""``idemstore stats`` on PostgreSQL: one aggregate query over the records table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.stats import counted_in_one_query

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.backends.stats import StoreStats

__all__ = ["STATS", "counted"]

# One aggregate pass over the table (COUNT ... FILTER) by the database clock, one instant for
# the whole statement; the rules of the reads: past retention first, released tombstones are
# not live. Every count needs every row (there is no index on expires_at), so one sequential
# scan serves all. Read-only, it takes no row locks. {s}: the schema.
STATS = """
SELECT
    count(*) FILTER (WHERE expires_at > statement_timestamp() AND NOT released
                     AND status = 'in_progress' AND lease_expires_at > statement_timestamp()),
    count(*) FILTER (WHERE expires_at > statement_timestamp() AND NOT released
                     AND status = 'in_progress'
                     AND (lease_expires_at IS NULL OR lease_expires_at <= statement_timestamp())),
    count(*) FILTER (WHERE expires_at > statement_timestamp() AND NOT released
                     AND status = 'completed'),
    count(*) FILTER (WHERE expires_at <= statement_timestamp()),
    extract(epoch FROM statement_timestamp() - min(created_at) FILTER (
        WHERE expires_at > statement_timestamp() AND NOT released
          AND status = 'in_progress'))::float8,
    count(*)
  FROM {s}.idemstore_records"""


def counted(row: Sequence[Any]) -> StoreStats:
    """The stats in ``STATS``'s one row: a sequential scan of the table, read-only and
    lock-free; no limit applies."""
    return counted_in_one_query(
        row,
        method="one COUNT ... FILTER query over idemstore_records (a sequential scan)",
    )
