"""``postgresql://`` (also ``postgres://``): records in a PostgreSQL table, through asyncpg.

Every operation is one round trip to a server-side function installed by
``migrations/postgres`` or one statement; the database clock decides leases and retention;
``wait`` listens for NOTIFY. Modules: ``store`` (the store and its listener), ``statements``
(its SQL and lock hashing), ``listening`` (a wait's NOTIFY subscription), ``client_errors``
(asyncpg's errors mapped), ``options`` (its options table, readable without asyncpg).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.postgres.statements import hash64

__all__ = ["PostgresStore", "hash64"]

if TYPE_CHECKING:
    from idemstore.backends.postgres.store import PostgresStore


def __getattr__(name: str) -> Any:
    # The store (and with it the driver) is imported on first use, so that the package's
    # driver-free parts (``options``) can be read without the driver installed.
    if name == "PostgresStore":
        from idemstore.backends.postgres.store import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
