"""Which asyncpg connections of the caller may carry this store's completion.

``settle(response, connection=conn)`` runs the store's fenced ``complete`` on ``conn`` inside
the caller's transaction: ``conn`` must reach the very database (and schema) the store's pool
writes to, or the completion would land in another database, or nowhere. Identity is
(database name, server start time, the records table's oid): a replica, another server or
another database differs in at least one, and the query reads no table. It is asked once per
connection object (asyncpg keeps one object per server session, pooled or not).
"""

from __future__ import annotations

import weakref
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

__all__ = ["IDENTITY", "Identity", "session_of", "session_identity"]

Identity = tuple[str, str, int | None]

# $1 is the quoted schema's records table; to_regclass gives NULL where the schema is absent.
IDENTITY = (
    "SELECT current_database(), pg_postmaster_start_time()::text, to_regclass($1)::oid::bigint"
)

_SEEN: weakref.WeakKeyDictionary[asyncpg.Connection, Identity] = weakref.WeakKeyDictionary()


def session_of(connection: object) -> asyncpg.Connection | None:
    """The asyncpg session behind ``connection`` (a connection, or one acquired from a pool);
    ``None`` for anything else, or a pooled connection already given back."""
    # The proxy first: asyncpg makes a pool's proxy pass for an instance of Connection too.
    if isinstance(connection, PoolConnectionProxy):
        # The proxy has no public accessor for the session it wraps (and is not weakly
        # referenceable), while the session object lives as long as the pooled connection.
        inner: Any = connection._con
        return None if inner is None or isinstance(inner, PoolConnectionProxy) else inner
    if isinstance(connection, asyncpg.Connection):
        return connection
    return None


async def session_identity(session: asyncpg.Connection, table: str) -> Identity:
    """``session``'s identity: asked once, then remembered for the session's lifetime."""
    known = _SEEN.get(session)
    if known is None:
        row = await session.fetchrow(IDENTITY, table)
        known = (row[0], row[1], row[2])
        _SEEN[session] = known
    return known
