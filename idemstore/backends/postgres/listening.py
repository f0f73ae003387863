"""A ``wait``'s subscription to the NOTIFYs about one key, on the store's listener connection.

The store keeps one dedicated LISTEN connection and, per key (by its lock hash), the events of
the waits on it; a notification sets them. A hash collision only wakes a waiter that then
finds its key still held.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Subscription"]


class Subscription:
    """Registered in ``waiters`` until closed; pushing while the listener is up."""

    __slots__ = ("_listening", "_lock_key", "_waiters", "event")

    def __init__(
        self,
        waiters: dict[int, set[asyncio.Event]],
        lock_key: int,
        listening: Callable[[], bool],
    ) -> None:
        self._waiters = waiters
        self._lock_key = lock_key
        self._listening = listening
        self.event = asyncio.Event()
        waiters.setdefault(lock_key, set()).add(self.event)

    @property
    def pushing(self) -> bool:
        return self._listening()

    def close(self) -> None:
        waiters = self._waiters.get(self._lock_key)
        if waiters is not None:
            waiters.discard(self.event)
            if not waiters:
                del self._waiters[self._lock_key]
