"""``idemstore stats`` on Redis: SCAN of the key prefix and HMGET of each record, bounded."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.records import check_limit
from idemstore.stats import DEFAULT_LIMIT, StatsTally, StoreStats

if TYPE_CHECKING:
    from idemstore.backends.redis.store import RedisStore

__all__ = ["stats"]

BATCH = 1000
# The hash fields: st (p in progress, c completed, r released tombstone), then the created,
# retention and lease deadlines in microseconds of the server clock.
_STATUSES = {b"p": "in_progress", b"c": "completed", b"r": "released"}


async def stats(store: RedisStore, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
    """Read at most ``limit`` records: SCAN of the prefix (every primary on a cluster) and one
    HMGET of four fields per record, pipelined by 1000. Redis keeps no count by state, so this
    is a pass over the keyspace, bounded by ``limit``."""
    limit = check_limit(limit)
    store._check_open()
    complete = True
    try:
        client = await store._ready()
        async with asyncio.timeout(store._attempt_timeout):
            seconds, micros = await client.time()
        tally = StatsTally(seconds + micros / 1e6)
        names: list[bytes] = []
        async for name in store._prefix_keys(client, BATCH):
            if tally.scanned + len(names) >= limit:
                complete = False
                break
            names.append(name)
            if len(names) >= BATCH:
                await _tally_batch(store, client, names, tally)
                names = []
        if names:
            await _tally_batch(store, client, names, tally)
    except store._errors.catches as exc:
        raise store._errors.translate(exc) from exc
    method = "SCAN of the key prefix and HMGET of each record (a pass over the keyspace)"
    return tally.result(complete=complete, method=method)


async def _tally_batch(
    store: RedisStore, client: Any, names: list[bytes], tally: StatsTally
) -> None:
    await store._acquire_slot()
    try:
        pipe = client.pipeline(transaction=False) if not store._cluster else client.pipeline()
        for name in names:
            pipe.hmget(name, "st", "ca", "ea", "la")
        async with asyncio.timeout(store._attempt_timeout):
            rows = await pipe.execute()
    finally:
        store._slots.give()
    for status, created, expires, lease in rows:
        if status is None or expires is None:
            continue  # expired (or deleted) between SCAN and HMGET
        tally.add(
            _STATUSES.get(status, "released"),
            float(created or 0) / 1e6,
            float(expires) / 1e6,
            None if lease is None else float(lease) / 1e6,
        )
