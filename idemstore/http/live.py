"""A keyed response while it is being sent: the copy the recorder keeps, and what a retry
attached to it reads.

``LiveResponse`` holds the response of a running keyed request as the app sends it, up to the
recording limit: the recorder records it from here at its end, and a retry of the same request
that arrives meanwhile in the same process (``IdempotencyMiddleware``) follows it from its first
byte instead of being refused with 409. The original's sender only appends and wakes: it never
waits for a follower, so a slow follower cannot slow the original's client. Past the limit the
copy is dropped (memory stays bounded by the limit) and a follower still reading is cut, as is
one whose original was cut (an exception, a client gone).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemstore.http.wire import Send

__all__ = ["LiveResponse", "ResponseCut"]


class ResponseCut(Exception):
    """The response a follower was reading ended without its end: the follower's own response
    must be cut too (the server then closes the connection), never look complete."""


class LiveResponse:
    """The response of one running keyed request, as far as it was sent."""

    __slots__ = (
        "_changed",
        "chunks",
        "complete",
        "cut",
        "fingerprint",
        "headers",
        "limit",
        "overflowed",
        "size",
        "status",
        "unrecordable",
    )

    def __init__(self, limit: int, fingerprint: str = "") -> None:
        self.limit = limit
        self.fingerprint = fingerprint
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed = False
        self.unrecordable = ""
        self.complete = False
        self.cut = False
        self._changed = asyncio.Event()

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = headers
        self._wake()

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk``; past the limit, drop the copy (only the size is kept)."""
        self.size += len(chunk)
        if self.overflowed:
            return
        if self.size > self.limit:
            self.overflowed = True
            self.chunks = []
        elif chunk:
            self.chunks.append(chunk)
        self._wake()

    def end(self) -> None:
        """The response is complete (its outcome is settled)."""
        if not self.cut:
            self.complete = True
            self._wake()

    def stop(self) -> None:
        """The response ends here: cut, unless it was complete."""
        if not self.complete:
            self.cut = True
            self._wake()

    async def follow(self, send: Send, extra: tuple[bytes, bytes]) -> bool:
        """Send this response to another client from its first byte, as it comes (its start
        with ``extra`` added). ``False`` when it ended before it started (nothing was sent);
        ``ResponseCut`` when it was cut, or went past the limit, after its start went out."""
        while not self.status:
            if self.cut or self.complete:
                return False
            await self._changed.wait()
        headers = [*self.headers, extra]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        sent = 0
        while True:
            changed = self._changed
            if self.overflowed or (self.cut and not self.complete):
                raise ResponseCut
            while sent < len(self.chunks):
                chunk = self.chunks[sent]
                sent += 1
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if self.overflowed:
                    raise ResponseCut
            if self.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return True
            await changed.wait()
