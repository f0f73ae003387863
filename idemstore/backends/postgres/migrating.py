"""How a PostgreSQL store applies its migrations: one per transaction, under the schema's
transaction-level advisory lock, so concurrent migrators queue and each migration runs once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

from idemstore.backends.migrate import AppliedMigration, Migration, pending_migrations
from idemstore.backends.postgres.client_errors import missing_privilege
from idemstore.backends.postgres.statements import quote_ident

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["applied_migrations", "apply_pending", "migration_sql"]


def migration_sql(migration: Migration, schema: str) -> str:
    """The migration's SQL with the quoted ``schema`` in place of ``{{schema}}``."""
    return migration.sql.replace("{{schema}}", quote_ident(schema))


async def applied_migrations(
    pool: asyncpg.Pool, schema: str, applied_sql: str
) -> list[AppliedMigration]:
    """The migrations recorded in ``schema``'s versions table (none when it has none yet)."""
    async with pool.acquire() as conn:
        exists = await conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", f"{quote_ident(schema)}.idemstore_migrations"
        )
        if not exists:
            return []
        rows = await conn.fetch(applied_sql)
    return [AppliedMigration(row[0], row[1], row[2]) for row in rows]


async def apply_pending(
    pool: asyncpg.Pool,
    available: Sequence[Migration],
    *,
    schema: str,
    lock: int,
    sql: Mapping[str, str],
    where: str,
) -> list[Migration]:
    """Apply what is pending, one migration per transaction, each under the advisory ``lock``:
    each migrator re-reads the versions table after taking the lock. A refusal for a missing
    privilege names the privilege (``where``: the store, shown in the error)."""
    done: list[Migration] = []
    async with pool.acquire() as conn:
        while True:
            try:
                migration = await _apply_next(conn, available, schema, lock, sql)
            except asyncpg.InsufficientPrivilegeError as exc:
                role = await conn.fetchval("SELECT current_user")
                raise missing_privilege(exc, where, role) from exc
            if migration is None:
                return done
            done.append(migration)


async def _apply_next(
    conn: asyncpg.Connection,
    available: Sequence[Migration],
    schema: str,
    lock: int,
    sql: Mapping[str, str],
) -> Migration | None:
    """The next pending migration, applied in one transaction; None when none is."""
    quoted = quote_ident(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock)
        # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
        # exists: ask first, so a pre-created schema is enough.
        if not await conn.fetchval("SELECT true FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f"CREATE SCHEMA {quoted}")
        await conn.execute(sql["versions"])
        rows = await conn.fetch(sql["applied"])
        applied = [AppliedMigration(r[0], r[1], r[2]) for r in rows]
        pending = pending_migrations(available, applied)
        if not pending:
            return None
        migration = pending[0]
        await conn.execute(migration_sql(migration, schema))
        await conn.execute(
            f"INSERT INTO {quoted}.idemstore_migrations (name, checksum) VALUES ($1, $2)",
            migration.name,
            migration.checksum,
        )
    return migration
