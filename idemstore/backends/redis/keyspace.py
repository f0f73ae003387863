"""Passes over the store's keyspace: the SCAN of its key prefix that ``sweep`` and ``stats``
walk (every primary on a cluster), one bounded step at a time."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.backends.redis.codec import GLOB_SPECIAL, identity_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from idemstore.backends.driver_errors import DriverErrors
    from idemstore.backends.waiting import Sighting
    from idemstore.protocol import Record
    from idemstore.records import RecordQuery

__all__ = ["listed", "prefix_keys"]


async def prefix_keys(client: Any, prefix: str, count: int, step: float) -> AsyncIterator[bytes]:
    """The keys under ``prefix`` by SCAN (``count`` per step), each step within ``step``
    seconds (the data connections have no timeout of their own)."""
    pattern = prefix.translate(GLOB_SPECIAL).encode() + b"{*"
    names = client.scan_iter(match=pattern, count=count)
    try:
        while True:
            async with asyncio.timeout(step):
                name = await anext(names, None)
            if name is None:
                return
            yield name
    finally:
        await names.aclose()


async def listed(
    names: AsyncIterator[bytes],
    prefix: str,
    read: Callable[[str, str, bytes], Awaitable[Sighting]],
    errors: DriverErrors,
    query: RecordQuery,
) -> AsyncIterator[Record]:
    """The records of ``query`` among ``names`` (the SCAN of the prefix, every primary on a
    cluster): each read by the store's ``read`` (the get script: one round trip, the record
    and the server's clock), judged by that clock. A pass over the keyspace until the
    envelope has ``query.limit`` records; a scope narrows nothing but what is read."""
    try:
        async for name in names:
            identity = identity_of(prefix, name)
            if identity is None or (query.scope is not None and identity[0] != query.scope):
                continue
            sighting = await read(identity[0], identity[1], name)
            if sighting.record is not None and query.matches(sighting.record, sighting.now):
                yield sighting.record
    except errors.catches as exc:
        raise errors.translate(exc) from exc
