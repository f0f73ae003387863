"""The store's LISTEN connection (``Listener``) and a ``wait``'s subscription to the NOTIFYs
about one key on it (``Subscription``).

The store keeps one dedicated LISTEN connection and, per key (by its lock hash), the events of
the waits on it; a notification sets them. A hash collision only wakes a waiter that then
finds its key still held.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Listener", "Subscription"]


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


class Listener:
    """The store's one LISTEN connection, opened on the first ``wait`` that wants it, and the
    waits it wakes. While it is down (or ``enabled`` is false) waits poll; a failed connect is
    not tried again for ``RETRY`` seconds."""

    RETRY = 1.0

    __slots__ = (
        "_channel",
        "_command_timeout",
        "_connect_timeout",
        "_connection",
        "_dsn",
        "_enabled",
        "_errors",
        "_lock",
        "_retry_at",
        "_waiters",
    )

    def __init__(
        self,
        dsn: str,
        channel: str,
        *,
        enabled: bool,
        connect_timeout: float,
        command_timeout: float,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._dsn = dsn
        self._channel = channel
        self._enabled = enabled
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._errors = errors
        self._connection: asyncpg.Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._retry_at = 0.0
        self._waiters: dict[int, set[asyncio.Event]] = {}

    @property
    def up(self) -> bool:
        """Whether the LISTEN connection is open (so NOTIFYs push)."""
        return self._connection is not None and not self._connection.is_closed()

    def subscribe(self, lock_key: int) -> Subscription:
        """A wait's subscription to the key whose lock hash is ``lock_key``."""
        return Subscription(self._waiters, lock_key, lambda: self.up)

    async def ensure(self, closed: Callable[[], bool]) -> bool:
        """Whether the connection is up; tries to open it unless a recent try failed or the
        store is ``closed()``. Never raises: without it ``wait`` polls."""
        if not self._enabled or closed():
            return False
        if self.up:
            return True
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            return False
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.up:
                return True
            if loop.time() < self._retry_at:
                return False
            return await self._open(loop, closed)

    async def _open(self, loop: asyncio.AbstractEventLoop, closed: Callable[[], bool]) -> bool:
        connection = None
        try:
            connection = await asyncpg.connect(
                self._dsn,
                timeout=self._connect_timeout,
                command_timeout=self._command_timeout,
                statement_cache_size=0,
                server_settings={"application_name": "idemstore-listener"},
            )
            await connection.add_listener(self._channel, self._on_notify)
            connection.add_termination_listener(self._on_lost)
        except self._errors:
            self._retry_at = loop.time() + self.RETRY
            if connection is not None:
                connection.terminate()
            return False
        if closed():
            connection.terminate()
            return False
        self._connection = connection
        return True

    def close(self) -> None:
        """Drop the connection and wake every wait (each then looks again, and polls)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.terminate()
        self._wake_all()

    def _on_notify(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        try:
            lock_key = int(payload)
        except ValueError:
            return
        # A hash collision only wakes a waiter that then finds its key still held.
        for event in self._waiters.get(lock_key, ()):
            event.set()

    def _on_lost(self, connection: Any) -> None:
        if self._connection is connection:
            self._connection = None
            self._retry_at = asyncio.get_running_loop().time() + self.RETRY
        # Waiters look again at once and, with no listener, poll from now on.
        self._wake_all()

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()
