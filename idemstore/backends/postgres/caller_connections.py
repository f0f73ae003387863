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

from idemstore.errors import ConfigurationError

__all__ = [
    "IDENTITY",
    "Identity",
    "another_database",
    "caller_session",
    "session_identity",
    "session_of",
]

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


def caller_session(connection: object) -> asyncpg.Connection:
    """The session of the connection a caller handed to ``settle``: ``ConfigurationError``
    unless it is an asyncpg connection (or one acquired from a pool) with a transaction open."""
    session = session_of(connection)
    if session is None:
        raise ConfigurationError(
            f"connection=... on a PostgreSQL store needs an asyncpg connection (or "
            f"one acquired from an asyncpg pool, still held), not {type(connection).__name__}"
        )
    if not session.is_in_transaction():
        raise ConfigurationError(
            "connection=... needs the connection's transaction open (inside "
            "`async with connection.transaction():`): nothing was recorded"
        )
    return session


def another_database(theirs: Identity, schema: str, where: str) -> ConfigurationError:
    """The refusal of a caller's connection to a database other than the store's."""
    return ConfigurationError(
        f"connection=... was given a connection to database {theirs[0]!r},"
        f" not the one holding the idemstore schema {schema!r} of"
        f" {where}: the outcome must commit in the same database as your"
        " writes. Nothing was recorded"
    )
