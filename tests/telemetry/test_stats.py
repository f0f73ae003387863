"""``stats()`` and ``idemstore stats URL`` count what a scripted run left, on every engine."""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import TYPE_CHECKING

import pytest

from idemstore import open_store
from idemstore.backends.stats import StoreStats, SupportsStats
from idemstore.cli import main

if TYPE_CHECKING:
    from idemstore import IdempotencyStore

STATS_URL_FIXTURES: dict[str, str] = {
    "dynamodb": "dynamodb_store_url",
    "memory": "memory_store_url",
    "sqlite-file": "sqlite_file_store_url",
    "redis": "redis_store_url",
    "redis-cluster": "redis_cluster_store_url",
    "postgres": "postgres_store_url",
}
FINGERPRINT = "f" * 64
SHORT = 0.4


@pytest.fixture(params=sorted(STATS_URL_FIXTURES))
def any_store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(STATS_URL_FIXTURES[request.param]))


async def _leave_one_of_each(store: IdempotencyStore) -> None:
    """2 completed, 1 in progress, 1 lapsed, 1 past retention, 1 released (none of them)."""
    for key in ("done-1", "done-2"):
        reservation = await store.reserve(key, FINGERPRINT, lease_ttl=30, retention=600)
        assert reservation.lease is not None
        assert await store.complete(reservation.lease, b"ok")
    assert (await store.reserve("lapsing", FINGERPRINT, lease_ttl=SHORT, retention=600)).acquired
    expiring = await store.reserve("expiring", FINGERPRINT, lease_ttl=30, retention=600)
    assert expiring.lease is not None
    assert await store.complete(expiring.lease, b"ok", retention=SHORT)
    released = await store.reserve("released", FINGERPRINT, lease_ttl=30, retention=600)
    assert released.lease is not None
    assert await store.release(released.lease)
    await asyncio.sleep(SHORT + 0.2)
    assert (await store.reserve("running", FINGERPRINT, lease_ttl=30, retention=600)).acquired


async def test_stats_count_records_by_state(any_store_url: str) -> None:
    async with open_store(any_store_url) as store:
        assert isinstance(store, SupportsStats)
        await _leave_one_of_each(store)
        stats = await store.stats()
    assert isinstance(stats, StoreStats)
    assert (stats.in_progress, stats.lapsed, stats.completed, stats.expired) == (1, 1, 2, 1)
    assert stats.complete
    # The oldest in-progress record is the lapsed one, reserved before the pause.
    assert stats.oldest_in_progress_age is not None
    assert SHORT <= stats.oldest_in_progress_age < 60


async def test_an_empty_store_has_nothing_in_progress(any_store_url: str) -> None:
    async with open_store(any_store_url) as store:
        stats = await store.stats()  # type: ignore[attr-defined]
    assert (stats.in_progress, stats.lapsed, stats.completed, stats.expired) == (0, 0, 0, 0)
    assert stats.oldest_in_progress_age is None


async def test_sqlite_stats_binds_its_parameters_as_python_3_14_requires(
    sqlite_file_store_url: str,
) -> None:
    # Numbered placeholders (?1) bound from a sequence warn on 3.12 and 3.13 and raise
    # sqlite3.ProgrammingError from 3.14 on; on 3.11 this passes either way.
    async with open_store(sqlite_file_store_url) as store:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            stats = await store.stats()  # type: ignore[attr-defined]
    assert stats.complete is True


@pytest.mark.parametrize("fixture", ["redis_store_url", "dynamodb_store_url"])
async def test_a_scanning_backend_stops_at_the_limit_and_says_so(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    async with open_store(request.getfixturevalue(fixture)) as store:
        for i in range(5):
            await store.reserve(f"k{i}", FINGERPRINT, lease_ttl=30, retention=600)
        bounded = await store.stats(limit=3)  # type: ignore[attr-defined]
        whole = await store.stats(limit=5)  # type: ignore[attr-defined]
    assert not bounded.complete
    assert bounded.scanned == bounded.in_progress == 3
    assert whole.in_progress == 5


async def test_cli_stats_prints_the_counts(
    redis_store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_store(redis_store_url) as store:
        await _leave_one_of_each(store)
    assert await asyncio.to_thread(main, ["stats", redis_store_url]) == 0
    text = capsys.readouterr().out
    assert "in progress" in text and "SCAN" in text
    assert await asyncio.to_thread(main, ["stats", "--json", redis_store_url]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert counted["backend"] == "redis"
    assert (counted["in_progress"], counted["lapsed"], counted["completed"]) == (1, 1, 2)
    assert counted["expired"] == 1
