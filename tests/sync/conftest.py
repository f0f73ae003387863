"""Sync-runner tests get store URLs: the engines several threads or processes share."""

from __future__ import annotations

import pytest

# The engines the synchronous doors serve in production, plus the in-process one.
BACKENDS = {
    "memory": "memory_store_url",
    "sqlite": "sqlite_file_store_url",
    "redis": "redis_store_url",
    "postgres": "postgres_store_url",
}
# Engines whose records another store object (another loop, another process) sees.
SHARED = {name: fixture for name, fixture in BACKENDS.items() if name != "memory"}


@pytest.fixture(params=sorted(BACKENDS))
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(BACKENDS[request.param]))


@pytest.fixture(params=sorted(SHARED))
def shared_store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(SHARED[request.param]))


@pytest.fixture(params=["redis", "postgres"])
def server_store_url(request: pytest.FixtureRequest) -> str:
    """A store on a server engine (the policies are engine-neutral: two engines suffice)."""
    return str(request.getfixturevalue(BACKENDS[request.param]))
