"""The consumer suites' ``store``: a private, empty memory store per test.

It stands in for the ``idemstore.testing`` plugin's ``store`` (parametrized over every
registered backend): the HTTP and MCP server suites test the consumer, not the engine under it,
so one in-process engine is enough. A suite's ``conftest.py`` imports it to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from idemstore import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore.protocol import IdempotencyStore

__all__ = ["store"]


@pytest.fixture
async def store() -> AsyncIterator[IdempotencyStore]:
    async with open_store("memory://") as opened:
        yield opened
