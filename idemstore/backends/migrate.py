"""Schema migrations: ``NNNN_description.sql`` files per engine, applied in order, each in its
own transaction, recorded in a versions table with a checksum so an edited file is caught.

The runner is engine-neutral; a store whose engine declares the ``SQL_MIGRATIONS`` schema kind
(``idemstore.backends.registry``) implements ``SupportsMigrations`` and reads
``migrations/<engine>/``. ``SQLMigrations`` adapts such a store to the schema protocol of
``idemstore.backends.schema`` (status / plan / apply), which is what ``idemstore migrate URL``
runs; ``run_migrations(url)`` is the same for callers that want the typed ``MigrationRun``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar, cast, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from idemstore.backends.registry import SQL_MIGRATIONS, engine_for_url, scheme_of
from idemstore.backends.urls import open_store, redact_url
from idemstore.errors import SchemaError
from idemstore.protocol import offers

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "AppliedMigration",
    "Migration",
    "MigrationRun",
    "MigrationState",
    "SQLMigrations",
    "StoreSchemaTool",
    "SupportsMigrations",
    "load_migrations",
    "migrate_hint",
    "migration_engine",
    "migration_states",
    "migrations_dir",
    "pending_migrations",
    "run_migrations",
    "schema_file",
]

MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# The live schema beside an engine's migrations: documentation and a test oracle
# (tests/test_schema_file.py), never applied, so the runner skips it.
SCHEMA_FILE = "schema.sql"


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
    """What a store with a schema offers the migration runner and the CLI.

    The runner calls these on a store it has not entered (no ``async with``, which may check
    or migrate the schema): each method connects by itself if it must, works whether or not
    the schema exists, and never migrates as a side effect. The runner calls ``close()`` after.
    """

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
    return Path(__file__).resolve().parents[2] / "migrations"


def migrations_dir(engine: str) -> Path:
    """The folder ``engine``'s migration files are read from (inside the wheel when installed)."""
    return _migrations_root() / engine


def schema_file(engine: str) -> Path:
    """``engine``'s live schema (``migrations/<engine>/schema.sql``): what a database holds
    after every migration, for reading; fresh installs still run the migrations."""
    return migrations_dir(engine) / SCHEMA_FILE


def migration_engine(url: str) -> str | None:
    """The migrations folder a store URL's engine uses (its registry name), or ``None`` for
    engines whose schema is not SQL migration files."""
    engine = engine_for_url(url)
    if engine is None or engine.schema != SQL_MIGRATIONS:
        return None
    return engine.name


def load_migrations(engine: str) -> list[Migration]:
    """Every migration of ``engine`` ("sqlite", "postgres"), in version order."""
    folder = migrations_dir(engine)
    if not folder.is_dir():
        raise SchemaError(f"no migrations for {engine!r} found at {folder}")
    migrations: list[Migration] = []
    for path in sorted(folder.iterdir()):
        if path.suffix != ".sql" or path.name == SCHEMA_FILE:
            continue
        if not MIGRATION_NAME.match(path.name):
            raise SchemaError(f"migration file {path.name!r} is not named NNNN_description.sql")
        data = path.read_bytes()
        migration = Migration(path.name, data.decode("utf-8"), hashlib.sha256(data).hexdigest())
        if migrations and migrations[-1].version == migration.version:
            # Two files with one number would apply in name order on one database and could
            # apply in another order elsewhere; refuse rather than guess.
            raise SchemaError(
                f"migrations {migrations[-1].name!r} and {migration.name!r} share version "
                f"{migration.version:04d}; renumber one"
            )
        migrations.append(migration)
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


@dataclass(frozen=True, slots=True)
class MigrationRun:
    """What ``run_migrations`` (or ``SQLMigrations``) found and did: a schema report.

    ``engine`` is ``None`` when the store keeps no SQL schema: nothing to do. ``states`` lists
    every known migration as it stands after the run; ``applied`` what this run applied;
    ``planned`` the pending migrations with the SQL a dry run would execute. ``mode`` is the
    schema-protocol call that produced it: ``status``, ``plan`` or ``apply``.
    """

    url: str
    engine: str | None
    source: Path | None = None
    states: tuple[MigrationState, ...] = ()
    applied: tuple[Migration, ...] = ()
    planned: tuple[tuple[Migration, str], ...] = ()
    mode: str = "apply"

    @property
    def pending(self) -> list[MigrationState]:
        return [state for state in self.states if state.applied_at is None]

    @property
    def up_to_date(self) -> bool:
        return not self.pending

    def render(self) -> str:
        """What ``idemstore migrate`` prints: plain text, one fact per line."""
        if self.engine is None:
            scheme = scheme_of(self.url)
            return f"{scheme}:// stores keep no schema: nothing to migrate"
        if self.mode == "status":
            lines = [f"{self.engine} migrations from {self.source}"]
            width = max((len(state.name) for state in self.states), default=0)
            for state in self.states:
                when = "pending" if state.applied_at is None else f"applied {_when(state)}"
                lines.append(f"{state.name:<{width}}  sha256:{state.checksum}  {when}")
            pending = len(self.pending)
            lines.append(f"{len(self.states) - pending} applied, {pending} pending")
            return "\n".join(lines)
        if self.mode == "plan":
            if not self.planned:
                return "schema is up to date: nothing to apply"
            blocks = [
                f"-- {m.name} (pending, sha256:{m.checksum})\n{sql}" for m, sql in self.planned
            ]
            return "\n".join(blocks).rstrip("\n")
        count = len(self.states)
        if not self.applied:
            return f"schema already up to date ({count} migration(s)): nothing to apply"
        lines = [f"applied {m.name}" for m in self.applied]
        lines.append(f"schema up to date ({count} migration(s))")
        return "\n".join(lines)


def _when(state: MigrationState) -> str:
    import datetime as dt

    assert state.applied_at is not None
    moment = dt.datetime.fromtimestamp(state.applied_at, dt.UTC)
    return moment.isoformat(timespec="milliseconds")


S = TypeVar("S")


class StoreSchemaTool(Generic[S]):
    """What a schema protocol does before anything else: refuse a store that lacks the
    methods its schema kind needs (``_needs``, whose methods ``_offers`` names), and keep the
    store's URL without its password for reports."""

    __slots__ = ("_engine", "_store", "_url")

    _needs: ClassVar[type]
    _offers: ClassVar[str]
    _kind: ClassVar[str]

    def __init__(self, store: object, *, url: str, engine: str) -> None:
        if not offers(store, self._needs):
            raise SchemaError(
                f"the {engine} store does not offer {self._offers}, which its {self._kind}"
                " schema kind needs"
            )
        self._store = cast("S", store)
        self._url = redact_url(url)
        self._engine = engine


class SQLMigrations(StoreSchemaTool[SupportsMigrations]):
    """The schema protocol for a store with SQL migration files (``SupportsMigrations``).

    Works on a store that has not been entered; never migrates except in ``apply``.
    """

    __slots__ = ()

    _needs = SupportsMigrations
    _offers = "applied_migrations / apply_migrations / migration_sql"
    _kind = "SQL_MIGRATIONS"

    async def status(self) -> MigrationRun:
        available = load_migrations(self._engine)
        applied_rows = await self._store.applied_migrations()
        pending_migrations(available, applied_rows)  # a history that disagrees is an error
        states = migration_states(available, applied_rows)
        return MigrationRun(
            self._url, self._engine, migrations_dir(self._engine), tuple(states), mode="status"
        )

    async def plan(self) -> MigrationRun:
        available = load_migrations(self._engine)
        applied_rows = await self._store.applied_migrations()
        pending = pending_migrations(available, applied_rows)
        planned = tuple((m, self._store.migration_sql(m)) for m in pending)
        states = tuple(migration_states(available, applied_rows))
        source = migrations_dir(self._engine)
        return MigrationRun(self._url, self._engine, source, states, (), planned, mode="plan")

    async def apply(self) -> MigrationRun:
        available = load_migrations(self._engine)
        applied = await self._store.apply_migrations(available)
        states = migration_states(available, await self._store.applied_migrations())
        source = migrations_dir(self._engine)
        return MigrationRun(
            self._url, self._engine, source, tuple(states), tuple(applied), mode="apply"
        )


def migrate_hint(url: str, *, password_variable: str | None = None) -> str:
    """The command that brings the schema of the store at ``url`` up to date, for an error
    message: ``url`` as given when it holds no password (ready to paste); else ``url``
    without its password, which messages never show, and where the password may come from
    instead (``password_variable``, such as PostgreSQL's ``PGPASSWORD``)."""
    if redact_url(url) == url:
        return f"run: idemstore migrate {shlex.quote(url)}"
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        password = None
    if password is None:  # a password urlsplit cannot find: show nothing of the URL
        return "run: idemstore migrate URL, with this store's URL (not shown: it holds a password)"
    host = parts.netloc.rsplit("@", 1)[1]
    bare = urlunsplit(parts._replace(netloc=f"{parts.username or ''}@{host}"))
    where = f"with {password_variable} set to" if password_variable else "with"
    return f"run: idemstore migrate {shlex.quote(bare)} {where} the password (not shown here)"


async def run_migrations(
    url: str, *, dry_run: bool = False, status: bool = False, **options: Any
) -> MigrationRun:
    """Bring the schema of the store at ``url`` up to date, or only report on it.

    ``dry_run`` plans (returns each pending migration's SQL) and ``status`` reads the versions
    table; neither writes. A second run applies nothing. Stores whose schema is not SQL
    migration files return a run whose ``engine`` is ``None``
    (``idemstore.backends.schema.run_schema`` covers every kind).
    """
    store = open_store(url, **options)
    try:
        engine = migration_engine(url)
        if engine is None or not offers(store, SupportsMigrations):
            return MigrationRun(redact_url(url), None)
        migrations = SQLMigrations(store, url=url, engine=engine)
        if status:
            return await migrations.status()
        if dry_run:
            return await migrations.plan()
        return await migrations.apply()
    finally:
        await store.close()
