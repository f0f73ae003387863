"""A background task that removes expired records on an interval."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from idemstore.execution.hooks import current_observer
from idemstore.protocol import AsyncContext
from idemstore.records import check_duration

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore

__all__ = ["Sweeper"]

logger = logging.getLogger("idemstore.backends.sweeper")


class Sweeper(AsyncContext):
    """Calls ``store.sweep(limit=...)`` every ``every`` seconds while running.

    A pass that removed a full batch runs again at once, so a backlog drains without waiting
    for the next tick. A failing pass is logged and retried on the next tick; the sweeper never
    dies of it. Use as ``async with Sweeper(store): ...`` or ``start()`` / ``stop()``.
    """

    __slots__ = ("_store", "_task", "every", "limit", "removed")

    def __init__(self, store: IdempotencyStore, *, every: float = 60.0, limit: int = 1000) -> None:
        self.every = check_duration("every", every)
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self.removed = 0
        self._store = store
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> int:
        """One pass: sweep batches until one comes back short. Returns how many went."""
        total = 0
        # Counted in idemstore.sweep.removed once idemstore.instrument() was called.
        observer = current_observer()
        store = self._store if observer is None else observer.store_view(self._store)
        while True:
            removed = await store.sweep(limit=self.limit)
            total += removed
            self.removed += removed
            if removed < self.limit:
                return total

    async def _loop(self) -> None:
        # Ends once stop() forgot this task, not only on cancel(): a driver may swallow a
        # cancellation that lands as its call completes (redis-py through asyncio.wait_for on
        # Python 3.11, CPython gh-86296).
        me = asyncio.current_task()
        while self._task is me:
            try:
                removed = await self.sweep_once()
                if removed:
                    logger.info("swept %d expired idempotency records", removed)
            except Exception:
                logger.exception("idempotency sweep failed; retrying in %.1fs", self.every)
            if self._task is not me:
                return
            await asyncio.sleep(self.every)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="idemstore-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # gather, not suppress(CancelledError): our caller's own cancellation propagates.
            await asyncio.gather(task, return_exceptions=True)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _enter(self) -> None:
        self.start()

    async def _leave(self, exc: BaseException | None) -> None:
        await self.stop()
