"""Passes over the store's keyspace: the SCAN of its key prefix that ``sweep`` and ``stats``
walk (every primary on a cluster), one bounded step at a time."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.backends.redis.codec import GLOB_SPECIAL

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["prefix_keys"]


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
