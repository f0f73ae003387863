"""How the SQLite store runs work on a connection's thread: one-hop transactions, busy errors,
and the end of a connection that failed to open.

aiosqlite runs every call of a connection on one thread of its own. A transaction made of
awaited ``execute`` calls (BEGIN, statements, COMMIT) crosses between the event loop and that
thread once per statement; ``one_hop`` makes the whole transaction one call on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import aiosqlite

__all__ = ["busy", "in_thread", "one_hop", "stopped", "worth_retrying"]

_T = TypeVar("_T")


async def stopped(conn: aiosqlite.Connection) -> None:
    """Wait for the worker thread of a connection that failed to open.

    aiosqlite stops that thread without waiting for it; if the event loop closes first (a CLI
    run ends), the thread dies printing a traceback. Joining it keeps failures to our one line.
    """
    thread = getattr(conn, "_thread", None)
    if isinstance(thread, threading.Thread) and thread.is_alive():
        await asyncio.to_thread(thread.join, 5.0)


def busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLITE_BUSY (any extended code): another connection holds a lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY


def worth_retrying(exc: Exception) -> bool:
    """Whether an attempt that raised ``exc`` may be tried again: the file was busy."""
    return isinstance(exc, sqlite3.OperationalError) and busy(exc)


def _raw(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection inside ``conn``; only for code running on its thread.

    aiosqlite has no public way to run a function of ours on a connection's thread, which a
    one-hop transaction needs: its ``_conn`` and ``_execute``, which each of its public methods
    has used since its first releases, are the way in, confined to here and ``in_thread``.
    """
    raw: sqlite3.Connection = conn._conn
    return raw


def in_thread(conn: aiosqlite.Connection, function: Callable[[], _T]) -> Awaitable[_T]:
    """``function()`` on ``conn``'s thread, after everything queued there before it."""
    execute: Any = conn._execute
    result: Awaitable[_T] = execute(function)
    return result


def one_hop(
    conn: aiosqlite.Connection,
    clock: Callable[[], float],
    body: Callable[[sqlite3.Connection, float], _T],
    abandoned: threading.Event,
) -> Callable[[], _T]:
    """A function for ``in_thread``: ``BEGIN IMMEDIATE``, ``clock()`` read once the write lock
    is held (deadlines are written in commit order), ``body(connection, now)``, ``COMMIT``.

    Any error rolls the whole transaction back: a busy BEGIN or COMMIT is retried from the
    start by the caller. Once ``abandoned`` is set (the caller was cancelled while the call was
    queued or running) the transaction rolls back instead of committing, unless COMMIT has
    begun: the same window a cancellation landing during an awaited COMMIT always had.
    """

    def transaction() -> _T:
        if abandoned.is_set():
            raise asyncio.CancelledError
        raw = _raw(conn)
        raw.execute("BEGIN IMMEDIATE")
        try:
            result = body(raw, clock())
            if abandoned.is_set():
                raise asyncio.CancelledError
            raw.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                raw.execute("ROLLBACK")
            raise
        return result

    return transaction
