"""``migrations/<engine>/schema.sql``, the live schema written once for readers, equals what a
database holds after every migration: each engine builds one database by migrating from empty
and one by running the schema file, dumps both catalogs, and compares them line by line.

The migration runner's versions table (``idemstore_migrations``) is left out of both dumps: the
runner creates it, not a migration, and the schema file does not describe it.
"""

from __future__ import annotations

import difflib
import re
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING

import pytest

from idemstore.backends.migrate import load_migrations, run_migrations, schema_file
from idemstore.testing.fixtures.postgres import drop_schema, new_schema

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

VERSIONS = "idemstore_migrations"
VERSIONS_OBJECTS = (VERSIONS, f"{VERSIONS}_pkey")  # the table and its primary key index


def assert_same_schema(migrated: list[str], from_file: list[str], engine: str) -> None:
    """Equal dumps, or a failure that shows the unified diff (``-`` migrated, ``+`` file)."""
    if migrated == from_file:
        return
    diff = difflib.unified_diff(
        migrated,
        from_file,
        fromfile=f"{engine}: migrated from empty",
        tofile=f"migrations/{engine}/schema.sql",
        lineterm="",
    )
    pytest.fail(
        f"migrations/{engine}/schema.sql is not the schema the migrations build; update it "
        "(or the migration) until they agree:\n" + "\n".join(diff),
        pytrace=False,
    )


# -- PostgreSQL --------------------------------------------------------------------------------

# Each query yields (owner, text): owner is the table or object the line belongs to, so the
# versions table's rows can be dropped; $1 is the schema. Together they cover every object a
# migration can create in the schema. Function text is pg_get_functiondef: header as the
# catalog holds it, body byte for byte.
PG_CATALOG = (
    # Every relation: tables, indexes, sequences, views (with their definition), composite types.
    """SELECT c.relname, concat_ws(' ', 'relation', c.relname, 'kind=' || c.relkind::text,
              'persistence=' || c.relpersistence::text,
              'options=' || coalesce(array_to_string(c.reloptions, ','), ''),
              CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END)
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1""",
    # Columns of tables and composite types, numbered in order without dropped ones.
    """SELECT c.relname, concat_ws(' ', 'column', c.relname || '.' || a.attname,
              '#' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
              format_type(a.atttypid, a.atttypmod),
              CASE WHEN a.attnotnull THEN 'NOT NULL' END,
              'collate=' || co.collname,
              'default=' || pg_get_expr(d.adbin, d.adrelid),
              CASE WHEN a.attgenerated <> '' THEN 'generated=' || a.attgenerated::text END,
              CASE WHEN a.attidentity <> '' THEN 'identity=' || a.attidentity::text END)
         FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_collation co ON co.oid = a.attcollation
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'p', 'c', 'v', 'm', 'f')""",
    """SELECT c.relname, concat_ws(' ', 'constraint', c.relname || '.' || k.conname,
              pg_get_constraintdef(k.oid))
         FROM pg_constraint k
         JOIN pg_class c ON c.oid = k.conrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1""",
    """SELECT tablename, concat_ws(' ', 'index', indexname, indexdef)
         FROM pg_indexes WHERE schemaname = $1""",
    """SELECT c.relname, concat_ws(' ', 'trigger', c.relname || '.' || t.tgname,
              pg_get_triggerdef(t.oid))
         FROM pg_trigger t
         JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND NOT t.tgisinternal""",
    """SELECT p.proname, concat_ws(E'\n',
              'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
              CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
                   ELSE 'kind=' || p.prokind::text END)
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = $1""",
    # Types of their own (enums, domains, ranges); composite types are relations above, and
    # array types and table row types come with what they belong to.
    """SELECT t.typname, concat_ws(' ', 'type', t.typname, 'kind=' || t.typtype::text,
              'base=' || format_type(NULLIF(t.typbasetype, 0), NULL),
              'labels=' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                              FROM pg_enum e WHERE e.enumtypid = t.oid))
         FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = $1 AND t.typtype IN ('e', 'd', 'r', 'm')""",
)


async def pg_schema_dump(dsn: str, schema: str) -> list[str]:
    """The catalog of ``schema``, sorted, with the schema's name written ``{{schema}}``."""
    import asyncpg

    from idemstore.backends.postgres.statements import quote_ident

    connection = await asyncpg.connect(dsn)
    try:
        rows: list[Any] = []
        for query in PG_CATALOG:
            rows += await connection.fetch(query, schema)
    finally:
        await connection.close()
    lines: list[str] = []
    for owner, text in sorted((r[0], r[1]) for r in rows if r[0] not in VERSIONS_OBJECTS):
        # Quoted first: function bodies hold the name as the migrations wrote it ("t_…").
        text = text.replace(quote_ident(schema), "{{schema}}").replace(schema, "{{schema}}")
        first, *rest = text.splitlines()
        # Each line of a function names it, so a diff's few lines of context say whose they are.
        lines += [first, *(f"{owner} | {line}" for line in rest)]
    return lines


async def pg_schema_from_file(dsn: str, schema: str, sql: str) -> None:
    """Create ``schema`` and run the schema file ``sql`` in it, as one transaction."""
    import asyncpg

    from idemstore.backends.postgres.statements import quote_ident

    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            await connection.execute(f"CREATE SCHEMA {quote_ident(schema)}")
            await connection.execute(sql.replace("{{schema}}", quote_ident(schema)))
    finally:
        await connection.close()


async def pg_dump_of_file(dsn: str, sql: str) -> list[str]:
    schema = new_schema()
    try:
        await pg_schema_from_file(dsn, schema, sql)
        return await pg_schema_dump(dsn, schema)
    finally:
        await drop_schema(dsn, schema)


async def test_a_postgres_schema_migrated_from_empty_equals_schema_sql(
    postgres_server: str, postgres_store_url: str, postgres_schema: str
) -> None:
    # postgres_store_url ran `idemstore migrate` on the empty postgres_schema.
    migrated = await pg_schema_dump(postgres_server, postgres_schema)
    assert any(line.startswith("function idemstore_reserve(") for line in migrated)
    from_file = await pg_dump_of_file(postgres_server, schema_file("postgres").read_text())
    assert_same_schema(migrated, from_file, "postgres")


async def test_the_postgres_comparison_sees_one_changed_line_of_a_function(
    postgres_server: str,
) -> None:
    sql = schema_file("postgres").read_text()
    line = "fence = r.fence + 1,"  # reserve's take-over
    assert sql.count(line) == 1
    changed = sql.replace(line, "fence = r.fence + 2,")
    first = await pg_dump_of_file(postgres_server, sql)
    second = await pg_dump_of_file(postgres_server, changed)
    assert first != second
    assert sum(a != b for a, b in zip(first, second, strict=True)) == 1


# -- SQLite ------------------------------------------------------------------------------------

# Comments and runs of whitespace, but not inside string literals ('--' is a string there).
SQL_NOISE = re.compile(r"('(?:[^']|'')*')|(?:\s|--[^\n]*|/\*.*?\*/)+", re.DOTALL)


def normalized_sql(sql: str | None) -> str:
    """``sql`` without comments, its whitespace collapsed: what SQLite acts on."""
    if sql is None:
        return "-"  # automatic indexes (UNIQUE, PRIMARY KEY) keep no SQL
    return SQL_NOISE.sub(lambda m: m.group(1) or " ", sql).strip()


# What SQLite made of each table and index (views and triggers are their SQL alone).
SQLITE_PRAGMAS = {
    "table": ("table_xinfo", "index_list", "foreign_key_list"),
    "index": ("index_xinfo",),
}


def sqlite_schema_dump(path: Path) -> list[str]:
    """sqlite_master, then the PRAGMA views of every table and index, sorted by name."""
    lines: list[str] = []
    with closing(sqlite3.connect(path)) as conn:
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE tbl_name <> ? ORDER BY type, name",
            (VERSIONS,),
        ).fetchall()
        for kind, name, table, sql in objects:
            lines.append(f"{kind} {name} on {table}: {normalized_sql(sql)}")
            for pragma in SQLITE_PRAGMAS.get(kind, ()):
                for row in conn.execute(f"SELECT * FROM pragma_{pragma}(?)", (name,)):
                    lines.append(f"  {pragma}({name}): {row}")
        lines.append(f"user_version: {conn.execute('PRAGMA user_version').fetchone()[0]}")
    return lines


def sqlite_dump_of_file(path: Path, sql: str) -> list[str]:
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(sql)
    return sqlite_schema_dump(path)


async def test_a_sqlite_database_migrated_from_empty_equals_schema_sql(tmp_path: Path) -> None:
    run = await run_migrations(f"sqlite:///{tmp_path / 'migrated.db'}")
    assert [m.name for m in run.applied] == [m.name for m in load_migrations("sqlite")]
    migrated = sqlite_schema_dump(tmp_path / "migrated.db")
    assert any(line.startswith("table idemstore_records ") for line in migrated)
    from_file = sqlite_dump_of_file(tmp_path / "file.db", schema_file("sqlite").read_text())
    assert_same_schema(migrated, from_file, "sqlite")


def test_the_sqlite_comparison_sees_one_changed_constraint_but_not_a_comment(
    tmp_path: Path,
) -> None:
    sql = schema_file("sqlite").read_text()
    check = "CHECK (fence >= 1)"
    assert sql.count(check) == 1
    first = sqlite_dump_of_file(tmp_path / "first.db", sql)
    changed = sql.replace(check, "CHECK (fence >= 0)")
    assert sqlite_dump_of_file(tmp_path / "changed.db", changed) != first
    commented = sql.replace("    token ", "    -- a comment only\n    token ", 1)
    assert sqlite_dump_of_file(tmp_path / "commented.db", commented) == first


def test_normalized_sql_keeps_comment_marks_inside_strings() -> None:
    sql = "CREATE TABLE t (\n  a TEXT -- note\n  DEFAULT '--x' /* c */\n)"
    assert normalized_sql(sql) == "CREATE TABLE t ( a TEXT DEFAULT '--x' )"
