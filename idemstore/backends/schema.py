"""The schema protocol: ``status`` / ``plan`` / ``apply``, whatever form a schema takes.

An engine's registry entry (``idemstore.backends.registry.Engine.schema``) names its schema kind:
``SQL_MIGRATIONS`` (numbered SQL files, ``idemstore.backends.migrate.SQLMigrations``), ``TABLE`` (a
table the store creates and describes itself, ``TableSchema``), a ``"module:Class"`` adapter
of its own, or ``None`` (nothing to migrate). ``schema_manager(store, url)`` builds the
adapter; ``idemstore migrate`` and ``idemstore bench --local`` go through it and never ask
which engine they hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from idemstore.backends.migrate import SQLMigrations, StoreSchemaTool
from idemstore.backends.registry import (
    SQL_MIGRATIONS,
    TABLE,
    engine_for_url,
    load_target,
    scheme_of,
)
from idemstore.backends.urls import open_store, redact_url
from idemstore.errors import SchemaError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "MayBeAbsent",
    "NoSchema",
    "SchemaManager",
    "SchemaMode",
    "SchemaReport",
    "SupportsTableSchema",
    "TableReport",
    "TableSchema",
    "run_schema",
    "schema_manager",
]

SchemaMode = Literal["status", "plan", "apply"]


@runtime_checkable
class SchemaReport(Protocol):
    """What a schema call found or did. ``up_to_date``: nothing is (or, after ``apply``,
    remains) to be done; ``render()``: the text ``idemstore migrate`` prints."""

    @property
    def up_to_date(self) -> bool: ...

    def render(self) -> str: ...


class SchemaManager(Protocol):
    """One store's schema, whatever its form.

    Every method works on a store that has not been entered (no ``async with``), connects by
    itself if it must, and works whether or not the schema exists. ``status`` and ``plan``
    never write; ``apply`` is idempotent (a second call changes nothing) and safe against a
    concurrent ``apply``.
    """

    async def status(self) -> SchemaReport:
        """What exists and what is missing."""
        ...

    async def plan(self) -> SchemaReport:
        """What ``apply`` would do, as the engine would run it (SQL, a table definition)."""
        ...

    async def apply(self) -> SchemaReport:
        """Bring the schema up to date and say what changed."""
        ...


@dataclass(frozen=True, slots=True)
class _NoSchemaReport:
    url: str
    up_to_date: bool = True

    def render(self) -> str:
        scheme = scheme_of(self.url)
        return f"{scheme}:// stores keep no schema: nothing to migrate"


class NoSchema:
    """The schema protocol of a store that keeps none (memory, Redis): nothing to do."""

    __slots__ = ("_url",)

    def __init__(self, store: object, *, url: str, engine: str) -> None:
        self._url = redact_url(url)

    async def status(self) -> SchemaReport:
        return _NoSchemaReport(self._url)

    async def plan(self) -> SchemaReport:
        return _NoSchemaReport(self._url)

    async def apply(self) -> SchemaReport:
        return _NoSchemaReport(self._url)


@runtime_checkable
class SupportsTableSchema(Protocol):
    """A store whose schema is one table it creates and describes itself."""

    def table_definition(self) -> dict[str, Any]:
        """The table as the engine's create request (JSON-serializable)."""
        ...

    async def table_status(self) -> dict[str, Any]:
        """Facts about the table; ``"table"`` (its name) and ``"exists"`` at least."""
        ...

    async def create_table(self) -> bool:
        """Create or fix the table; ``False`` when it was already right (nothing done)."""
        ...


@runtime_checkable
class MayBeAbsent(Protocol):
    """A store whose database may not exist yet (a SQLite file), which it can tell without
    creating it."""

    async def absent_database(self) -> str | None:
        """Why there is no database, or None when there is one."""
        ...


@dataclass(frozen=True, slots=True)
class TableReport:
    """What ``TableSchema`` found (``status``), would do (``plan``) or did (``apply``)."""

    url: str
    mode: SchemaMode
    table: str
    facts: dict[str, Any] = field(default_factory=dict)
    definition: dict[str, Any] = field(default_factory=dict)
    changed: bool = False

    @property
    def up_to_date(self) -> bool:
        if self.mode == "apply":
            return True
        return bool(self.facts.get("exists")) and all(
            value is not False for value in self.facts.values()
        )

    def render(self) -> str:
        if self.mode == "status":
            return "\n".join(f"{name:>14}: {value}" for name, value in self.facts.items())
        if self.mode == "plan":
            return json.dumps(self.definition, indent=2)
        if self.changed:
            return f"table {self.table!r} is ready (created or updated)"
        return f"table {self.table!r} already has the right schema: nothing to do"


class TableSchema(StoreSchemaTool[SupportsTableSchema]):
    """The schema protocol for a ``SupportsTableSchema`` store (DynamoDB's table and TTL)."""

    __slots__ = ()

    _needs = SupportsTableSchema
    _offers = "table_definition / table_status / create_table"
    _kind = "TABLE"

    async def status(self) -> TableReport:
        facts = await self._store.table_status()
        return TableReport(self._url, "status", str(facts.get("table", "")), facts=facts)

    async def plan(self) -> TableReport:
        definition = self._store.table_definition()
        return TableReport(self._url, "plan", _table_name(definition), definition=definition)

    async def apply(self) -> TableReport:
        changed = await self._store.create_table()
        definition = self._store.table_definition()
        name = _table_name(definition)
        return TableReport(self._url, "apply", name, definition=definition, changed=changed)


def _table_name(definition: dict[str, Any]) -> str:
    # Create requests name the table "TableName" (DynamoDB) or "name"; say nothing otherwise.
    return str(definition.get("TableName") or definition.get("name") or "")


_KINDS: dict[str, Callable[..., SchemaManager]] = {
    SQL_MIGRATIONS: SQLMigrations,
    TABLE: TableSchema,
}


def schema_manager(store: object, url: str) -> SchemaManager:
    """The schema adapter the registry names for ``url``'s engine, around ``store``."""
    engine = engine_for_url(url)
    if engine is None or engine.schema is None:
        return NoSchema(store, url=url, engine=engine.name if engine else "")
    build = _KINDS.get(engine.schema)
    if build is None:
        build = load_target(engine.schema)
    manager: SchemaManager = build(store, url=url, engine=engine.name)
    return manager


async def run_schema(url: str, mode: SchemaMode = "apply", **options: Any) -> SchemaReport:
    """Open the store at ``url``, run one schema call on it, close it: ``idemstore migrate``."""
    store = open_store(url, **options)
    try:
        manager = schema_manager(store, url)
        if mode == "status":
            # A status only reads: a database that is not there is an error, not a report of
            # every migration pending (which would suggest it exists, empty).
            if isinstance(store, MayBeAbsent) and (why := await store.absent_database()):
                raise SchemaError(why)
            return await manager.status()
        if mode == "plan":
            return await manager.plan()
        return await manager.apply()
    finally:
        await store.close()
