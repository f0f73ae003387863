"""``sqlite:///path/to/file.db``: records in one SQLite file that several processes on one host
may share (WAL mode), or ``sqlite:///:memory:`` for one store object in one process.

Modules: ``store`` (connections, locking, the contract), ``statements`` (its SQL and the
decoding of rows) and ``options`` (its options table, readable without aiosqlite).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.registry import imported_on_first_use
from idemstore.backends.sqlite.statements import split_statements

__all__ = ["SQLiteStore", "split_statements"]

if TYPE_CHECKING:
    from idemstore.backends.sqlite.store import SQLiteStore


__getattr__ = imported_on_first_use(
    __name__, SQLiteStore="idemstore.backends.sqlite.store:SQLiteStore"
)
