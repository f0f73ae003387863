"""Processes running the sync runner, and the async one, share a store: each key runs once."""

from __future__ import annotations

import uuid

import pytest

from tests.process_race import race

SERVER_STORES = {"redis": "redis_store_url", "postgres": "postgres_store_url"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(SERVER_STORES))
def test_sync_and_async_processes_execute_each_key_once(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = request.getfixturevalue(SERVER_STORES[backend])
    keys = [f"sync-race-{i}-{uuid.uuid4().hex[:8]}" for i in range(10)]
    report = race(
        url,
        keys,
        processes=4,
        tasks_per_key=3,
        racers=("tests.sync.sync_racer", "tests.process_race"),
    )
    assert report.errors == []
    assert dict(report.executions) == dict.fromkeys(keys, 1)
    assert all(len(report.values[k]) == 1 for k in keys)
    assert set(report.values) == set(keys)
