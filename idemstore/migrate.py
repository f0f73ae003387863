"""Schema migrations: ``NNNN_description.sql`` files per engine, applied in order, each in its
own transaction, recorded in a versions table with a checksum so an edited file is caught.

The runner is engine-neutral; a store that has a schema implements ``SupportsMigrations``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from idemstore.errors import SchemaError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "AppliedMigration",
    "Migration",
    "MigrationState",
    "SupportsMigrations",
    "load_migrations",
    "migration_states",
    "pending_migrations",
]

MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: ``name`` is the file name, ``checksum`` the SHA-256 of its bytes."""

    name: str
    sql: str
    checksum: str

    @property
    def version(self) -> int:
        return int(self.name[:4])


@dataclass(frozen=True, slots=True)
class AppliedMigration:
    """A row of the versions table."""

    name: str
    checksum: str
    applied_at: float


@dataclass(frozen=True, slots=True)
class MigrationState:
    """A migration and whether it is applied (``applied_at``) or pending (``None``)."""

    name: str
    checksum: str
    applied_at: float | None


@runtime_checkable
class SupportsMigrations(Protocol):
    """What a store with a schema offers the migration runner and the CLI."""

    async def applied_migrations(self) -> list[AppliedMigration]:
        """The versions table, in order; empty when it does not exist yet."""
        ...

    async def apply_migrations(self, available: Sequence[Migration]) -> list[Migration]:
        """Under the engine's lock: re-read what is applied, check it with
        ``pending_migrations``, apply each pending migration in its own transaction together
        with its versions-table row, and return what was applied."""
        ...

    def migration_sql(self, migration: Migration) -> str:
        """The SQL exactly as ``apply_migrations`` would run it (for ``--dry-run``)."""
        ...


def _migrations_root() -> Path:
    # Installed: force-included into the wheel as idemstore/_migrations. Source checkout or
    # editable install: the top-level migrations/ folder beside the package.
    packaged = resources.files("idemstore").joinpath("_migrations")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "migrations"


def load_migrations(engine: str) -> list[Migration]:
    """Every migration of ``engine`` ("sqlite", "postgres"), in version order."""
    folder = _migrations_root() / engine
    if not folder.is_dir():
        raise SchemaError(f"no migrations for {engine!r} found at {folder}")
    migrations = []
    for path in sorted(folder.iterdir()):
        if path.suffix != ".sql":
            continue
        if not MIGRATION_NAME.match(path.name):
            raise SchemaError(f"migration file {path.name!r} is not named NNNN_description.sql")
        data = path.read_bytes()
        migrations.append(
            Migration(path.name, data.decode("utf-8"), hashlib.sha256(data).hexdigest())
        )
    return migrations


def pending_migrations(
    available: Sequence[Migration], applied: Sequence[AppliedMigration]
) -> list[Migration]:
    """What is left to apply; ``SchemaError`` when history and files disagree."""
    known = {m.name: m for m in available}
    for row in applied:
        migration = known.get(row.name)
        if migration is None:
            raise SchemaError(
                f"the database has migration {row.name!r}, which this version of idemstore "
                "does not know: it was migrated by a newer version; upgrade idemstore"
            )
        if migration.checksum != row.checksum:
            raise SchemaError(
                f"migration {row.name!r} changed after it was applied (checksum "
                f"{row.checksum[:12]} in the database, {migration.checksum[:12]} on disk); "
                "restore the original file and add a new migration instead"
            )
    done = {row.name for row in applied}
    return [m for m in available if m.name not in done]


def migration_states(
    available: Sequence[Migration], applied: Sequence[AppliedMigration]
) -> list[MigrationState]:
    """Every known migration with its applied time, for ``idemstore migrate --status``."""
    when = {row.name: row.applied_at for row in applied}
    return [MigrationState(m.name, m.checksum, when.get(m.name)) for m in available]
