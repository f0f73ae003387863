"""Newline-delimited messages over byte streams, as the stdio proxy relays them: what it reads
from and writes to, a line reader with a limit far past asyncio's, and a whole-message write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncio

__all__ = ["CHUNK", "ByteReader", "ByteWriter", "LineReader", "LineTooLong", "written"]

# How much one read asks for.
CHUNK = 256 * 1024


class ByteReader(Protocol):
    """What the proxy reads from: ``asyncio.StreamReader`` fits."""

    async def read(self, n: int = -1, /) -> bytes:
        """Up to ``n`` bytes; ``b""`` at end of stream."""
        ...


class ByteWriter(Protocol):
    """What the proxy writes to: ``asyncio.StreamWriter`` fits."""

    def write(self, data: bytes, /) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class LineTooLong(Exception):
    """A line longer than the reader's limit was skipped whole."""


class LineReader:
    """Newline-delimited messages up to ``limit`` bytes (asyncio's readline stops at 64 KiB)."""

    __slots__ = ("_buffer", "_eof", "_limit", "_reader", "_scanned")

    def __init__(self, reader: ByteReader, limit: int) -> None:
        self._reader = reader
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes already searched for a newline, so long lines stay O(n)
        self._eof = False

    async def readline(self) -> bytes:
        """The next line with its newline; the unterminated tail at EOF; ``b""`` after that.

        Raises ``LineTooLong`` once a line past ``limit`` has been skipped whole.
        """
        while True:
            index = self._buffer.find(b"\n", self._scanned)
            if index >= 0:
                line = bytes(self._buffer[: index + 1])
                del self._buffer[: index + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                await self._skip_line()
                raise LineTooLong
            if self._eof:
                line = bytes(self._buffer)
                self._buffer.clear()
                self._scanned = 0
                return line
            chunk = await self._reader.read(CHUNK)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

    async def _skip_line(self) -> None:
        self._buffer.clear()
        self._scanned = 0
        while not self._eof:
            chunk = await self._reader.read(CHUNK)
            if not chunk:
                self._eof = True
                return
            index = chunk.find(b"\n")
            if index >= 0:
                self._buffer += chunk[index + 1 :]
                return


async def written(
    writer: ByteWriter | None, lock: asyncio.Lock, data: bytes
) -> BaseException | None:
    """Write ``data`` whole, one writer at a time; the error when the other side has gone."""
    assert writer is not None
    async with lock:
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, RuntimeError, ValueError) as exc:
            return exc
    return None
