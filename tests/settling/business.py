"""The caller's side of settling in a transaction: a business table in the store's database,
written through the caller's own connection (asyncpg or aiosqlite), for tests and the crash
proof. The table has no unique constraint on the key on purpose: only the fence may keep a key
from being charged twice.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["Business", "open_business"]


class Business:
    """One caller connection to the store's database, and its ``charges`` table."""

    def __init__(self, connection: Any, engine: str, table: str) -> None:
        self.connection = connection
        self.engine = engine
        self.table = table
        self._transaction: Any = None

    async def create_table(self) -> None:
        await self.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (key text NOT NULL, by_pid integer)"
        )

    async def begin(self) -> None:
        if self.engine == "postgres":
            self._transaction = self.connection.transaction()
            await self._transaction.start()
        else:
            await self.connection.execute("BEGIN")

    async def begin_read_only(self) -> None:
        """A read-only transaction (SQLite: ``query_only`` until the rollback)."""
        if self.engine == "postgres":
            self._transaction = self.connection.transaction(readonly=True)
            await self._transaction.start()
        else:
            await self.connection.execute("PRAGMA query_only = ON")
            await self.connection.execute("BEGIN")

    async def charge(self, key: str) -> None:
        if self.engine == "postgres":
            sql = f"INSERT INTO {self.table} (key, by_pid) VALUES ($1, $2)"
            await self.connection.execute(sql, key, os.getpid())
        else:
            sql = f"INSERT INTO {self.table} (key, by_pid) VALUES (?, ?)"
            await self.connection.execute(sql, (key, os.getpid()))

    async def commit(self) -> None:
        if self.engine == "postgres":
            await self._transaction.commit()
        else:
            await self.connection.execute("COMMIT")

    async def rollback(self) -> None:
        if self.engine == "postgres":
            if self._transaction is not None and not self.connection.is_closed():
                await self._transaction.rollback()
        else:
            await self.connection.execute("ROLLBACK")
            await self.connection.execute("PRAGMA query_only = OFF")

    async def charges(self) -> dict[str, int]:
        """How many rows each key has."""
        sql = f"SELECT key, count(*) FROM {self.table} GROUP BY key"
        if self.engine == "postgres":
            rows = await self.connection.fetch(sql)
        else:
            rows = await self.connection.execute_fetchall(sql)
        return {row[0]: row[1] for row in rows}

    async def close(self) -> None:
        await self.connection.close()


async def open_business(store_url: str) -> Business:
    """A caller connection to the database of the store at ``store_url``."""
    parts = urlsplit(store_url)
    if parts.scheme.startswith("postgres"):
        import asyncpg

        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema", "public")
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(query), ""))
        connection = await asyncpg.connect(dsn)
        return Business(connection, "postgres", f'"{schema}".charges')
    import aiosqlite

    path = unquote(parts.path[1:])
    connection = await aiosqlite.connect(path, isolation_level=None, timeout=10)
    await connection.execute("PRAGMA journal_mode = WAL")
    return Business(connection, "sqlite", "charges")
