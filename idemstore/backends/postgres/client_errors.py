"""How asyncpg's exceptions map onto the idemstore error family, declared once."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from idemstore.backends.driver_errors import DriverErrors, Rule, of_type, read_only, unavailable
from idemstore.backends.migrate import migrate_hint
from idemstore.backends.postgres.statements import quote_ident
from idemstore.errors import SchemaError, StoreUnavailableError

__all__ = [
    "OTHER_SCHEMAS",
    "connect_timed_out",
    "driver_errors",
    "migrate_command",
    "missing_privilege",
    "unmigrated",
]

# The other schemas of the database that hold an idemstore records table: when the URL's
# schema is not migrated, the one an operator did migrate is most likely among them.
OTHER_SCHEMAS = """
SELECT table_schema::text FROM information_schema.tables
 WHERE table_name = 'idemstore_records' AND table_schema <> $1
 ORDER BY 1 LIMIT 5"""


def driver_errors(where: str, migrate: str) -> DriverErrors:
    """How asyncpg's exceptions map onto the idemstore family, for the store at ``where``
    (its URL without the password); ``migrate`` says how to migrate it."""
    return DriverErrors(
        # Everything asyncpg raises, socket errors and timeouts.
        catches=(
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
            OSError,
            TimeoutError,
        ),
        rules=(
            Rule(
                of_type(
                    asyncpg.UndefinedTableError,
                    asyncpg.UndefinedFunctionError,
                    asyncpg.InvalidSchemaNameError,
                    asyncpg.UndefinedObjectError,
                ),
                lambda exc: SchemaError(
                    f"the idemstore schema at {where} is missing or incomplete ({exc}); {migrate}"
                ),
            ),
            # A read-only transaction (or a hot standby): retrying the same write never helps.
            Rule(
                of_type(asyncpg.ReadOnlySQLTransactionError),
                read_only(f"PostgreSQL at {where}"),
            ),
        ),
        otherwise=unavailable(f"PostgreSQL at {where}"),
    )


def connect_timed_out(where: str, connect_timeout: float) -> StoreUnavailableError:
    """The error for a pool whose first connection to the store at ``where`` ran out of
    ``connect_timeout``: asyncpg's bound covers every host, the TLS attempt and its plain
    retry, and the login, so nothing more was tried."""
    return StoreUnavailableError(
        f"PostgreSQL at {where} timed out connecting: no connection within connect_timeout"
        f" ({connect_timeout:g} s; is a PostgreSQL server listening there, and up?)"
    )


def migrate_command(url: str, schema: str | None = None) -> str:
    """How to migrate the store at ``url``: libpq's (and asyncpg's) ``PGPASSWORD`` carries the
    password the hint leaves out. With ``schema``, the command names it as ``?schema=`` even
    where ``url`` left it to the default, so it migrates the schema the store reads."""
    if schema is not None:
        url = with_schema(url, schema)
    return migrate_hint(url, password_variable="PGPASSWORD")


def with_schema(url: str, schema: str) -> str:
    """``url`` with its ``?schema=`` said (``schema``, unless the URL names one already)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.scheme not in ("postgres", "postgresql") or any(k == "schema" for k, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))


def unmigrated(
    schema: str, where: str, missing: list[str], others: list[str], migrate: str
) -> SchemaError:
    """The error of a store whose schema lacks migrations: which ``?schema=`` it looked in,
    the command that migrates that one, and the schemas that do hold idemstore records (the
    one migrated, when the app's URL left its ``?schema=`` out)."""
    message = (
        f"the idemstore schema {schema!r} (the URL's ?schema=, default public) at {where}"
        f" lacks migration(s) {', '.join(missing)}; {migrate}"
    )
    if others:
        named = ", ".join(map(repr, others))
        message += (
            f". Schema(s) {named} of this database hold idemstore records: if you migrated"
            f" one of those, add its ?schema= (e.g. ?schema={others[0]}) to this store's URL"
        )
    return SchemaError(message)


# What PostgreSQL says when a statement lacks a privilege (SQLSTATE 42501): creating a table
# needs CREATE on its schema, creating the schema CREATE on the database, and altering a table
# (a later migration) owning it.
_DENIED = re.compile(r"permission denied for (schema|database) (.+)")
_NOT_OWNER = re.compile(r"must be owner of (\w+) (.+)")
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


def _sql_name(name: str) -> str:
    return name if _PLAIN_NAME.fullmatch(name) else quote_ident(name)


def missing_privilege(exc: BaseException, where: str, role: str) -> SchemaError:
    """The error for a migration of the store at ``where``, run as ``role``, that PostgreSQL
    refused for a missing privilege: which privilege on which object, and the statement that
    grants it."""
    said = str(exc)
    grantee = _sql_name(role)
    if denied := _DENIED.search(said):
        kind, name = denied.groups()
        # USAGE too: a role that may create in a schema must also be able to look into it.
        privilege = "USAGE, CREATE" if kind == "schema" else "CREATE"
        need = f"the CREATE privilege on {kind} {name}"
        fix = (
            f"as the {kind}'s owner or a superuser, run"
            f" `GRANT {privilege} ON {kind.upper()} {_sql_name(name)} TO {grantee};`"
            " (or migrate as a role that has it)"
        )
    elif not_owner := _NOT_OWNER.search(said):
        kind, name = not_owner.groups()
        need = f"to own {kind} {name}"
        fix = (
            f"migrate as its owner, or as a superuser run"
            f" `ALTER {kind.upper()} {name} OWNER TO {grantee};`"
        )
    else:
        need = "a privilege PostgreSQL refused"
        fix = "migrate as the owner of the schema, or grant the role what the message names"
    return SchemaError(
        f"migrating the idemstore schema at {where} needs {need}, which role {role} lacks"
        f" ({said}): {fix}"
    )
