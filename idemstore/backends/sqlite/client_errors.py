"""How sqlite3's exceptions map onto the idemstore error family, declared once."""

from __future__ import annotations

import sqlite3

from idemstore.backends.driver_errors import (
    DriverErrors,
    Rule,
    message_has,
    read_only,
    unavailable,
)
from idemstore.errors import ResponseTooLargeError, SchemaError, StoreUnavailableError

__all__ = ["driver_errors", "read_timed_out"]


def _too_big(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLITE_TOOBIG ("string or blob too big")."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG or "too big" in str(exc)


def driver_errors(database: str, busy_timeout: float) -> DriverErrors:
    """How sqlite3's exceptions map onto the idemstore family, for the file ``database``."""
    where = f"SQLite database {database!r}"
    migrate = f"run `idemstore migrate sqlite:///{database}`"
    return DriverErrors(
        catches=(sqlite3.Error,),
        rules=(
            Rule(
                message_has("no such table"),
                lambda exc: SchemaError(f"the {where} has no idemstore schema ({exc}); {migrate}"),
            ),
            # SQLITE_TOOBIG: only a response can pass the engine's length limit (keys,
            # scopes and fingerprints are bounded far below it). Not "unavailable": the
            # caller must release the key rather than retry the same response.
            Rule(
                _too_big,
                lambda exc: ResponseTooLargeError(
                    f"the response exceeds the {where}'s length limit "
                    f"(SQLITE_MAX_LENGTH): {exc}. Store large results elsewhere and "
                    "record a reference, or release the lease"
                ),
            ),
            Rule(
                message_has("unable to open"),
                lambda exc: StoreUnavailableError(
                    f"cannot open the {where}: {exc} "
                    "(does its directory exist, and may this process write there?)"
                ),
            ),
            # query_only, or a file opened read-only: retrying the same write never helps.
            Rule(message_has("readonly database"), read_only(where)),
            Rule(
                message_has("locked", "busy"),
                lambda exc: StoreUnavailableError(
                    f"the {where} stayed locked by another connection for longer than "
                    f"busy_timeout={busy_timeout:g}s: {exc}"
                ),
            ),
            Rule(
                lambda exc: isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc),
                lambda exc: StoreUnavailableError(f"{database!r} is not an SQLite database: {exc}"),
            ),
        ),
        otherwise=unavailable(where),
    )


def read_timed_out(database: str) -> StoreUnavailableError:
    """What a ``wait`` whose reads could not finish within its timeout raises."""
    return StoreUnavailableError(
        f"the SQLite database {database!r} could not be read within the wait's "
        "timeout (does another connection hold a lock on it?)"
    )
