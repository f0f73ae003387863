"""``postgresql://`` (also ``postgres://``): records in a PostgreSQL table, through asyncpg.

Every operation is one round trip to a server-side function installed by
``migrations/postgres`` or one statement; the database clock decides leases and retention;
``wait`` listens for NOTIFY. Modules: ``store`` (the store and its listener), ``statements``
(its SQL and lock hashing), ``listening`` (a wait's NOTIFY subscription), ``client_errors``
(asyncpg's errors mapped).
"""

from __future__ import annotations

from idemstore.backends.postgres.statements import hash64
from idemstore.backends.postgres.store import PostgresStore

__all__ = ["PostgresStore", "hash64"]
