"""``idemstore stats`` on SQLite: one COUNT query over the records table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.stats import counted_in_one_query

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.backends.stats import StoreStats

__all__ = ["STATS", "counted"]

# One pass over the table (SQLite has no cheaper count), by the rules of the reads: past
# retention first, whatever the state; tombstones are not live; then the lease. :now is now
# (named: numbered placeholders bound from a sequence fail from Python 3.14 on).
STATS = """
SELECT
    count(*) FILTER (WHERE expires_at > :now AND status = 'in_progress'
                     AND lease_expires_at > :now),
    count(*) FILTER (WHERE expires_at > :now AND status = 'in_progress'
                     AND (lease_expires_at IS NULL OR lease_expires_at <= :now)),
    count(*) FILTER (WHERE expires_at > :now AND status = 'completed'),
    count(*) FILTER (WHERE expires_at <= :now),
    min(created_at) FILTER (WHERE expires_at > :now AND status = 'in_progress'),
    count(*)
FROM idemstore_records
"""


def counted(row: Sequence[Any], now: float) -> StoreStats:
    """The stats in ``STATS``'s one row, read at ``now``: a full scan of the table, on the
    read connection (never queued behind writes); no limit applies."""
    return counted_in_one_query(
        row,
        oldest_age=lambda oldest: None if oldest is None else max(0.0, now - oldest),
        method="one COUNT query over idemstore_records (a full table scan)",
    )
