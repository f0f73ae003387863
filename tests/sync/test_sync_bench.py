"""The ``sync`` bench scenario measures the sync runner beside the async one, per target."""

from __future__ import annotations

from idemstore.bench.results import Measurement
from idemstore.bench.runner import Target
from idemstore.bench.scenarios import Load
from idemstore.bench.sync_scenario import run_sync


async def test_sync_scenario_times_both_runners_and_runs_each_key_once(
    redis_store_url: str,
) -> None:
    load = Load(concurrency=1, ops=20, duration=None, payload_bytes=256)
    (measured,) = await run_sync([Target("redis", redis_store_url)], load, "test")
    assert isinstance(measured, Measurement)
    assert measured.floor is not None and measured.floor_name == "async runner"
    assert measured.subject.executions == measured.subject.unique_keys > 0
    assert measured.floor.executions == measured.floor.unique_keys > 0
    assert "added_p50_ms" in measured.notes
