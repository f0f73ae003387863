"""The caller's own aiosqlite connection, given as ``connection=...`` to settle or checkpoint
inside the caller's transaction: what it must be, and which database file it is on."""

from __future__ import annotations

import asyncio
import os
import weakref

import aiosqlite

from idemstore.errors import ConfigurationError

__all__ = ["main_file", "usable_connection"]

# The main database file of each caller connection, asked once per connection object
# (PRAGMA database_list): a connection never changes its main file.
_MAIN_FILES: weakref.WeakKeyDictionary[aiosqlite.Connection, str] = weakref.WeakKeyDictionary()


def usable_connection(connection: object, database: str) -> aiosqlite.Connection:
    """``connection``, if it is an aiosqlite connection with a transaction open and the store
    (on ``database``) is one another connection can reach; else ``ConfigurationError``."""
    if not isinstance(connection, aiosqlite.Connection):
        raise ConfigurationError(
            "connection=... on a SQLite store needs an aiosqlite connection to "
            f"{database!r}, not {type(connection).__name__}"
        )
    if database == ":memory:":
        raise ConfigurationError(
            "connection=... needs a store in a database file your connection can "
            "open too: a sqlite:///:memory: store's database is private to the store"
        )
    if not connection.in_transaction:
        raise ConfigurationError(
            "connection=... needs the connection's transaction open (BEGIN, or a "
            "write that opened one): nothing was recorded"
        )
    return connection


async def main_file(connection: aiosqlite.Connection) -> str:
    """The real path of ``connection``'s main database file; ``""`` for a private (in-memory
    or temporary) one."""
    main = _MAIN_FILES.get(connection)
    if main is None:
        rows = await connection.execute_fetchall("PRAGMA database_list")
        named = next((str(row[2]) for row in rows if row[1] == "main"), "")
        main = await asyncio.to_thread(os.path.realpath, named) if named else ""
        _MAIN_FILES[connection] = main
    return main
