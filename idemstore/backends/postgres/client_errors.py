"""How asyncpg's exceptions map onto the idemstore error family, declared once."""

from __future__ import annotations

import asyncpg

from idemstore.backends.driver_errors import DriverErrors, Rule, of_type, unavailable
from idemstore.errors import SchemaError

__all__ = ["driver_errors"]


def driver_errors(where: str) -> DriverErrors:
    """How asyncpg's exceptions map onto the idemstore family, for the store at ``where``."""
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
                    f"the idemstore schema at {where} is missing or incomplete ({exc}); "
                    f"run: idemstore migrate {where}"
                ),
            ),
        ),
        otherwise=unavailable(f"PostgreSQL at {where}"),
    )
