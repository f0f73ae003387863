"""The PostgreSQL sweep: batches that walk the records table in physical order, chunk by chunk.

The table has no index on ``expires_at`` (with one, every ``complete`` would be a non-HOT
update, see migration 0006), so a sweep reads the heap. It splits the table's pages into
chunks of ``chunk_pages`` and deletes each chunk's expired rows in batches of up to
``batch_size`` (one statement over the chunk's TID range each); a batch that comes back short
has left nothing expired in its chunk but locked rows, and the sweep moves on.

A batch stays inside its chunk and a full one is followed by another over the same chunk,
rather than resuming after the last row it deleted: a scan's row order is not promised (before
PostgreSQL 14, or under any plan other than a TID Range Scan, a scan may start mid-table and
wrap round), and a resume point taken from an unordered batch would skip rows. The cost is a
re-read of at most one chunk per full batch.

A sweep cut short by its ``limit`` remembers the chunk it stopped in; the next one resumes there
and wraps round to the first page, so no part of the table waits behind rows swept over and
over, and every sweep that returns less than its limit has visited every page once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["CHUNK_PAGES", "HeapSweep", "Tid"]

# A TID as asyncpg reads and writes it: (block, offset within the block).
Tid = tuple[int, int]

# 8 MB of 8 KB pages: a full batch re-reads at most this much, from the buffer cache mostly.
CHUNK_PAGES = 1024
# Past every block a table can have (block numbers are 32-bit): the open end of the last chunk,
# so rows on pages added while the sweep runs are not cut off mid-chunk.
_HEAP_END: Tid = (0xFFFFFFFF, 0)


class HeapSweep:
    """Where the next sweep of one store starts, and the batches that make a sweep.

    ``pages()`` says how many pages the table has now; ``batch(size, low, high)`` deletes up
    to ``size`` expired rows with ``low <= ctid < high`` and returns a row whose first column
    is how many went (``statements.SWEEP_BATCH``).
    """

    __slots__ = ("_resume_at", "batch_size", "chunk_pages")

    def __init__(self, batch_size: int, chunk_pages: int = CHUNK_PAGES) -> None:
        self.batch_size = batch_size
        self.chunk_pages = chunk_pages
        self._resume_at = 0  # a page number

    def _chunks(self, pages: int) -> list[tuple[Tid, Tid]]:
        """The chunks' TID ranges, from the resume point to the end, then from the start."""
        start = self._resume_at if self._resume_at < pages else 0
        segments = [(start, pages), (0, start)] if start else [(0, pages)]
        chunks = []
        for first_page, end_page in segments:
            for low in range(first_page, end_page, self.chunk_pages):
                high = min(low + self.chunk_pages, end_page)
                chunks.append(((low, 0), _HEAP_END if high == pages else (high, 0)))
        return chunks

    async def sweep(
        self,
        limit: int,
        pages: Callable[[], Awaitable[int]],
        batch: Callable[[int, Tid, Tid], Awaitable[Any]],
    ) -> int:
        """Delete up to ``limit`` expired rows, batch by batch; return how many went."""
        removed = 0
        for low, high in self._chunks(await pages()):
            while True:
                size = min(self.batch_size, limit - removed)
                count: int = (await batch(size, low, high))[0]
                removed += count
                if removed == limit:
                    self._resume_at = low[0]  # this chunk may hold more
                    return removed
                if count < size:
                    break  # nothing expired is left in this chunk but locked rows
        self._resume_at = 0
        return removed
