"""The Postgres store's options, declared once (see ``idemstore.backends.store_options``).

Imports no driver: ``idemstore options postgres`` and the docs read this table without
asyncpg installed.
"""

from __future__ import annotations

from idemstore.backends.clock_skew import CLOCK_OPTIONS
from idemstore.backends.postgres.statements import SCHEMA_NAME
from idemstore.backends.store_options import Option, Options, at_least
from idemstore.errors import ConfigurationError
from idemstore.records import MAX_KEY_LENGTH, check_duration

__all__ = ["OPTIONS"]


def _schema_name(name: str, value: str) -> str:
    if not SCHEMA_NAME.match(value):
        raise ConfigurationError(
            f"{name} must be an identifier of letters, digits and underscores "
            f"(at most 63, not starting with a digit), not {value!r}"
        )
    return value


OPTIONS = Options(
    Option(
        "schema",
        str,
        "public",
        "schema holding the tables and functions; letters, digits, `_`, at most 63 "
        "characters; always quoted, so case is kept",
        _schema_name,
    ),
    Option("pool_min_size", int, 1, "fewest connections the asyncpg pool keeps", at_least(0)),
    Option("pool_max_size", int, 10, "most connections the asyncpg pool opens", at_least(1)),
    Option(
        "command_timeout",
        float,
        10.0,
        "seconds a statement may take before it is cancelled (then `StoreUnavailableError`)",
        check_duration,
    ),
    Option(
        "connect_timeout",
        float,
        5.0,
        "seconds to open a connection: every host, TLS and its plain retry, and the login, "
        "within it; not retried (see [Connecting](#connecting))",
        check_duration,
    ),
    Option(
        "max_inactive_connection_lifetime",
        float,
        300.0,
        "seconds an idle pooled connection is kept (`0`: for ever)",
        at_least(0),
    ),
    Option(
        "statement_cache_size",
        int,
        100,
        "asyncpg's prepared-statement cache; **set `0` behind PgBouncer**",
        at_least(0),
    ),
    Option(
        "auto_migrate",
        bool,
        False,
        "apply pending migrations on first use instead of raising `SchemaError`",
    ),
    Option("listen", bool, True, "use LISTEN/NOTIFY for `wait`; `false` polls"),
    Option(
        "listen_dsn",
        str,
        None,
        "where the LISTEN connection goes: a direct server URL when the store URL is a PgBouncer",
        shown_default="the store's URL",
    ),
    Option("sweep_batch_size", int, 500, "rows deleted per `sweep` transaction", at_least(1)),
    Option("max_key_length", int, MAX_KEY_LENGTH, "longest accepted key", at_least(1)),
    *CLOCK_OPTIONS,
)
