"""A ``store`` fixture for suites that pick their engines with a ``store_url`` fixture.

It stands in for the ``idemstore.testing`` plugin's ``store`` (parametrized over the contract
targets) where a suite runs on engines of its own choosing; a module or ``conftest.py``
imports it next to its ``store_url`` to use it.
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
async def store(store_url: str) -> AsyncIterator[IdempotencyStore]:
    async with open_store(store_url) as opened:
        yield opened
