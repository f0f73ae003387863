"""The SQLite store's options, declared once (see ``idemstore.backends.store_options``).

Imports no driver: ``idemstore options sqlite`` and the docs read this table without
aiosqlite installed.
"""

from __future__ import annotations

import time

from idemstore.backends.store_options import Option, Options, at_least, check_clock, one_of
from idemstore.records import MAX_KEY_LENGTH, check_duration

__all__ = ["OPTIONS", "SYNCHRONOUS_MODES"]

SYNCHRONOUS_MODES = ("full", "normal")

OPTIONS = Options(
    Option(
        "synchronous",
        str,
        "full",
        "`full` (a commit survives power loss) or `normal` (faster; may lose the last commits)",
        one_of(*SYNCHRONOUS_MODES),
    ),
    Option(
        "busy_timeout",
        float,
        5.0,
        "seconds to wait for another connection's write lock before `StoreUnavailableError`",
        check_duration,
    ),
    Option(
        "auto_migrate",
        bool,
        True,
        "apply pending migrations on open; `false` raises `SchemaError` instead",
    ),
    Option("max_key_length", int, MAX_KEY_LENGTH, "longest key accepted", at_least(1)),
    Option("clock", object, time.time, "the time source, epoch seconds", check_clock, url=False),
)
