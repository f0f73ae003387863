"""``sweep`` on Redis: a walk of the prefix that removes records past retention.

Redis deletes every record by itself ``expiry_grace`` after its retention ends, so sweeping
is optional; this removes them sooner. A key past retention has at most the grace period
(plus 3 ms: the client computes the key's TTL, rounded) left to live, so only those are worth
a script call, and the script checks the retention deadline itself (a key whose TTL says
otherwise is never removed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["SWEEP_BATCH", "sweep_expired"]

# Keys asked for their TTL in one pipeline.
SWEEP_BATCH = 1000


async def sweep_expired(
    names: AsyncIterator[bytes],
    ttls: Callable[[list[bytes]], Awaitable[list[Any]]],
    sweep_one: Callable[[bytes], Awaitable[Any]],
    *,
    grace_ms: int,
    limit: int,
) -> int:
    """Remove up to ``limit`` of ``names`` past retention: their ``ttls`` (PTTL, pipelined)
    within the grace, then ``sweep_one`` (the script) on each; return how many it removed."""
    removed = 0
    batch: list[bytes] = []
    async for name in names:
        batch.append(name)
        if len(batch) >= SWEEP_BATCH:
            removed += await _sweep_batch(batch, ttls, sweep_one, grace_ms, limit - removed)
            batch = []
            if removed >= limit:
                return removed
    if batch:
        removed += await _sweep_batch(batch, ttls, sweep_one, grace_ms, limit - removed)
    return removed


async def _sweep_batch(
    names: list[bytes],
    ttls: Callable[[list[bytes]], Awaitable[list[Any]]],
    sweep_one: Callable[[bytes], Awaitable[Any]],
    grace_ms: int,
    room: int,
) -> int:
    removed = 0
    for name, ttl in zip(names, await ttls(names), strict=True):
        if removed >= room:
            break
        if isinstance(ttl, int) and 0 <= ttl <= grace_ms + 3:
            removed += int(await sweep_one(name))
    return removed
