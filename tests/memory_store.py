"""The consumer suites' ``store``: a private, empty memory store per test.

It stands in for the ``idemstore.testing`` plugin's ``store`` (parametrized over every
registered backend): the HTTP and MCP server suites test the consumer, not the engine under it,
so one in-process engine is enough. A suite's ``conftest.py`` imports it to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from idemstore import open_store
from idemstore.backends.memory import MemoryStore
from idemstore.errors import ResponseTooLargeError
from idemstore.execution.outcome_markers import MARKER_PREFIX

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore.protocol import IdempotencyStore

__all__ = ["SmallItemStore", "store"]


class SmallItemStore(MemoryStore):
    """A memory store with an item limit, as DynamoDB has: a response over ``LIMIT`` bytes is
    refused (``ResponseTooLargeError``); the execution path's small markers always fit."""

    LIMIT = 64

    async def complete(self, lease: Any, response: bytes, **options: Any) -> bool:
        if len(response) > self.LIMIT and not response.startswith(MARKER_PREFIX):
            raise ResponseTooLargeError(
                f"item over {self.LIMIT} bytes", size=len(response), limit=self.LIMIT
            )
        return await super().complete(lease, response, **options)


@pytest.fixture
async def store() -> AsyncIterator[IdempotencyStore]:
    async with open_store("memory://") as opened:
        yield opened
