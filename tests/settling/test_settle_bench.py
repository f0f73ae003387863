"""The ``settle`` bench scenario times both paths per SQL target and reports other stores."""

from __future__ import annotations

from idemstore.bench.results import Measurement, Unavailable
from idemstore.bench.runner import Target
from idemstore.bench.scenarios import Load
from idemstore.bench.settle_scenario import run_settle


async def test_settle_scenario_times_both_paths_on_postgres_and_sqlite_in_one_run(
    postgres_store_url: str, sqlite_file_store_url: str
) -> None:
    load = Load(concurrency=1, ops=20, duration=None, payload_bytes=256)
    targets = [Target("postgres", postgres_store_url), Target("sqlite", sqlite_file_store_url)]
    measured = await run_settle(targets, load, "test")
    for item in measured:
        assert isinstance(item, Measurement)
        assert item.floor is not None and item.floor.executions == item.floor.unique_keys > 0
        assert item.subject.executions == item.subject.unique_keys > 0
        assert "ratio_p50" in item.notes


async def test_settle_scenario_reports_a_store_outside_the_database_unavailable(
    memory_store_url: str,
) -> None:
    load = Load(concurrency=1, ops=4, duration=None, payload_bytes=256)
    (measured,) = await run_settle([Target("memory", memory_store_url)], load, "test")
    assert isinstance(measured, Unavailable) and "SQL store" in measured.reason
