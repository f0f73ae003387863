"""``sqlite:///path/to/file.db``: records in one SQLite file that several processes on one host
may share (WAL mode), or ``sqlite:///:memory:`` for one store object in one process.

Modules: ``store`` (connections, locking, the contract), ``statements`` (its SQL and the
decoding of rows) and ``options`` (its options table, readable without aiosqlite).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.sqlite.statements import split_statements

__all__ = ["SQLiteStore", "split_statements"]

if TYPE_CHECKING:
    from idemstore.backends.sqlite.store import SQLiteStore


def __getattr__(name: str) -> Any:
    # The store (and with it the driver) is imported on first use, so that the package's
    # driver-free parts (``options``) can be read without the driver installed.
    if name == "SQLiteStore":
        from idemstore.backends.sqlite.store import SQLiteStore

        return SQLiteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
