"""SQLite's side of ``idemstore migrate`` (``SupportsMigrations``): the versions table as it
reads, and a migration as the script ``apply_migrations`` runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.migrate import AppliedMigration, Migration, migrate_hint
from idemstore.backends.sqlite.statements import SELECT_VERSIONS, VERSIONS_EXISTS, statements_of

if TYPE_CHECKING:
    import aiosqlite

__all__ = ["absent_file", "applied_versions", "migration_script"]


async def applied_versions(conn: aiosqlite.Connection) -> list[AppliedMigration]:
    """The versions table, in order; empty when there is none yet."""
    if not list(await conn.execute_fetchall(VERSIONS_EXISTS)):
        return []
    rows = await conn.execute_fetchall(SELECT_VERSIONS)
    return [AppliedMigration(row[0], row[1], row[2]) for row in rows]


def migration_script(migration: Migration) -> str:
    """The statements ``apply_migrations`` runs for ``migration``, as one script."""
    body = ";\n\n".join(s.rstrip(";") for s in statements_of(migration))
    return f"BEGIN IMMEDIATE;\n\n{body};\n\nCOMMIT;\n"


def absent_file(database: str) -> str:
    """Why a database file that does not exist has nothing to read, and what to run."""
    return (
        f"the SQLite database {database} does not exist; "
        + migrate_hint(f"sqlite:///{database}")
        + " to create it with the schema"
    )
