"""``idemstore stats`` on Redis: what one record's hash fields say, for the store's bounded
SCAN of its key prefix with one pipelined HMGET per batch of records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from idemstore.backends.stats import StatsTally

__all__ = ["BATCH", "FIELDS", "METHOD", "tally_rows"]

# Records per SCAN step and per pipelined HMGET.
BATCH = 1000
# The hash fields read: st (p in progress, c completed, r released tombstone), then the
# created, retention and lease deadlines in microseconds of the server clock.
FIELDS = ("st", "ca", "ea", "la")
_STATUSES = {b"p": "in_progress", b"c": "completed", b"r": "released"}
METHOD = "SCAN of the key prefix and HMGET of each record (a pass over the keyspace)"


def tally_rows(tally: StatsTally, rows: Iterable[Any]) -> None:
    """Add each ``HMGET key *FIELDS`` answer to ``tally``."""
    for status, created, expires, lease in rows:
        if status is None or expires is None:
            continue  # expired (or deleted) between SCAN and HMGET
        tally.add(
            _STATUSES.get(status, "released"),
            float(created or 0) / 1e6,
            float(expires) / 1e6,
            None if lease is None else float(lease) / 1e6,
        )
