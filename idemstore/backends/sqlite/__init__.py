"""``sqlite:///path/to/file.db``: records in one SQLite file that several processes on one host
may share (WAL mode), or ``sqlite:///:memory:`` for one store object in one process.

Modules: ``store`` (connections, locking, the contract) and ``statements`` (its SQL and the
decoding of rows).
"""

from __future__ import annotations

from idemstore.backends.sqlite.statements import split_statements
from idemstore.backends.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore", "split_statements"]
