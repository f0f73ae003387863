"""``postgresql://`` (also ``postgres://``): records in a PostgreSQL table, through asyncpg.

Every operation is one round trip to a server-side function installed by
``migrations/postgres`` or one statement; the database clock decides leases and retention;
``wait`` listens for NOTIFY. Modules: ``store`` (the store and its listener), ``statements``
(its SQL and lock hashing), ``listening`` (a wait's NOTIFY subscription), ``client_errors``
(asyncpg's errors mapped), ``options`` (its options table, readable without asyncpg),
``migrating`` (applying migrations), ``host_lists`` (URLs naming several hosts) and
``caller_connections`` (settling on the caller's connection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.postgres.statements import hash64
from idemstore.backends.registry import imported_on_first_use

__all__ = ["PostgresStore", "hash64"]

if TYPE_CHECKING:
    from idemstore.backends.postgres.store import PostgresStore


__getattr__ = imported_on_first_use(
    __name__, PostgresStore="idemstore.backends.postgres.store:PostgresStore"
)
