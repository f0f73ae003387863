"""A Streamable HTTP client going away before its answer: how the gateway notices at once.

Under the 2026-07-28 revision a client cancels a request by closing its response stream
(there is no ``notifications/cancelled`` over HTTP, and no session), so the gateway must see
the disconnect when it happens, not when its next write fails: that may be the final
response, long after. Under 2025 revisions a disconnect is not a cancellation and the gateway
does not watch for one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse

__all__ = ["Receive", "WatchedStream", "until_disconnect"]

Receive = Callable[[], Awaitable[Mapping[str, Any]]]
"""An ASGI ``receive`` channel."""


async def until_disconnect(receive: Receive) -> None:
    """Return once the client has gone away (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class WatchedStream(StreamingResponse):
    """A relayed stream that tells ``on_disconnect`` when its client goes away before its
    end, at once: a send only fails at the next chunk, which may be the final response."""

    on_disconnect: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        told = self.on_disconnect
        if told is None:
            await super().__call__(scope, receive, send)
            return

        async def watch() -> None:
            await until_disconnect(receive)
            told()

        watcher = asyncio.ensure_future(watch())
        try:
            await super().__call__(scope, receive, send)
        finally:
            watcher.cancel()
