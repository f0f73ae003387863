"""The one ``store`` fixture the contract suite runs on, parametrized over every backend.

A new backend joins the suite with one line here: its id and the name of the fixture (in
tests/conftest.py or a plugin it lists) that yields a fresh store URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from idemstore import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

STORE_URL_FIXTURES: dict[str, str] = {
    "dynamodb": "dynamodb_store_url",
    "memory": "memory_store_url",
    "sqlite-file": "sqlite_file_store_url",
    "sqlite-memory": "sqlite_memory_store_url",
    "redis": "redis_store_url",
    "redis-cluster": "redis_cluster_store_url",
    "postgres": "postgres_store_url",
    "pgbouncer": "pgbouncer_store_url",
}


@pytest.fixture(params=sorted(STORE_URL_FIXTURES))
async def store(request: pytest.FixtureRequest) -> AsyncIterator[IdempotencyStore]:
    url = request.getfixturevalue(STORE_URL_FIXTURES[request.param])
    async with open_store(url) as opened:
        yield opened
