"""``idemstore stats`` on Redis: what one record's hash fields say, for the store's bounded
SCAN of its key prefix with one pipelined HMGET per batch of records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.stats import StatsTally

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

    from idemstore.backends.stats import StoreStats

__all__ = ["BATCH", "FIELDS", "METHOD", "count_records", "tally_rows"]

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


async def count_records(
    names: AsyncIterator[bytes],
    read: Callable[[list[bytes]], Awaitable[Iterable[Any]]],
    now: float,
    limit: int,
) -> StoreStats:
    """The stats of at most ``limit`` of the records ``names`` yields, ``read`` (an HMGET of
    ``FIELDS`` per name, pipelined) by batches of ``BATCH``; ``now`` is the server's clock."""
    complete = True
    tally = StatsTally(now)
    batch: list[bytes] = []
    async for name in names:
        if tally.scanned + len(batch) >= limit:
            complete = False
            break
        batch.append(name)
        if len(batch) >= BATCH:
            tally_rows(tally, await read(batch))
            batch = []
    if batch:
        tally_rows(tally, await read(batch))
    return tally.result(complete=complete, method=METHOD)
