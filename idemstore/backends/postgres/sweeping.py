"""The PostgreSQL sweep: batches that walk the records table in physical (TID) order.

The table has no index on ``expires_at`` (with one, every ``complete`` would be a non-HOT
update, see migration 0006), so a sweep reads the heap: each batch deletes up to its size of
expired rows from a TID range and says where it stopped, and the next batch starts there. A
sweep cut short by its ``limit`` remembers where it stopped; the next one resumes there and
wraps around to the first page, so every sweep that returns less than its limit has seen the
whole table once, and no part of the table waits behind rows swept over and over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["HEAP_END", "HEAP_START", "HeapSweep", "Tid"]

# A TID as asyncpg reads and writes it: (block, offset within the block).
Tid = tuple[int, int]

HEAP_START: Tid = (0, 0)
# Past every block a table can have (block numbers are 32-bit): the open end of a range.
HEAP_END: Tid = (0xFFFFFFFF, 0)


class HeapSweep:
    """Where the next sweep of one store starts, and the batches that make a sweep.

    ``batch(size, low, high)`` runs ``statements.SWEEP_BATCH``: it deletes up to ``size``
    expired rows with ``low <= ctid < high`` and returns a row (count, last TID deleted).
    """

    __slots__ = ("_resume_at", "batch_size")

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._resume_at = HEAP_START

    async def sweep(self, limit: int, batch: Callable[[int, Tid, Tid], Awaitable[Any]]) -> int:
        """Delete up to ``limit`` expired rows, batch by batch; return how many went."""
        removed = 0
        start = self._resume_at
        # From where the last sweep stopped to the end, then from the first page up to there.
        ranges = [(start, HEAP_END)] + ([(HEAP_START, start)] if start != HEAP_START else [])
        for low, high in ranges:
            while True:
                size = min(self.batch_size, limit - removed)
                count: int
                count, last = await batch(size, low, high)
                removed += count
                if count < size:
                    break  # nothing expired is left in [low, high) but locked rows
                low = (last[0], last[1])
                if removed == limit:
                    self._resume_at = low
                    return removed
        self._resume_at = HEAP_START
        return removed
