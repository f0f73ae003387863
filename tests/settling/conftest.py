"""Settling tests run on the engines that can settle inside the caller's transaction
(Postgres, SQLite), each with a fresh business table beside the store."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from tests.settling.business import Business, open_business
from tests.settling.owners import Takeover, taken_over
from tests.store_at_url import store as store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore


@pytest.fixture(params=["postgres_store_url", "sqlite_file_store_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


@pytest.fixture
async def business(store_url: str) -> AsyncIterator[Business]:
    opened = await open_business(store_url)
    await opened.create_table()
    yield opened
    await opened.close()


@pytest.fixture
async def takeover(store_url: str, store: IdempotencyStore) -> AsyncIterator[Takeover]:
    """A fresh key owned by a stale owner on ``store`` and, once its lease lapsed, by a
    successor on a second connection."""
    async with taken_over(store_url, store, f"stale-{uuid.uuid4().hex[:12]}") as owners:
        yield owners
