"""The bench's ``replay-cache`` probe: cached replays beside the engine's, on the same keys."""

from __future__ import annotations

import pytest

from idemstore.bench.replay_cache_scenario import ENGINE_REPLAY
from idemstore.bench.report import note_lines
from idemstore.bench.runner import BenchConfig, Target, run_bench


@pytest.mark.parametrize("url_fixture", ["memory_store_url", "redis_store_url"])
async def test_the_probe_replays_from_the_cache_beside_the_engine_and_runs_nothing(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    url = request.getfixturevalue(url_fixture)
    config = BenchConfig(scenarios=("replay-cache",), concurrency=(1,), ops=40)
    result = await run_bench([Target("store", url)], config)
    assert result.unavailable == []
    (measured,) = result.measurements
    assert measured.scenario == "replay-cache"
    assert measured.floor_name == ENGINE_REPLAY
    assert measured.floor is not None
    # Both sides replayed every operation: nothing ran, nothing failed.
    for side in (measured.subject, measured.floor):
        assert side.errors == {}
        assert side.executions == 0
        assert side.outcomes == {"completed": len(side.latencies_ns)}
    assert measured.exactly_once is True
    # Every timed cached replay was a hit (the preload and warm-up fill the cache).
    assert measured.notes["hits"] >= len(measured.subject.latencies_ns)


async def test_the_report_says_how_much_faster_the_cached_replay_was(
    memory_store_url: str,
) -> None:
    config = BenchConfig(scenarios=("replay-cache",), concurrency=(1,), ops=40)
    result = await run_bench([Target("memory", memory_store_url)], config)
    (line,) = [line for line in note_lines(result) if "replay-cache" in line]
    assert line.startswith("memory replay-cache: a replay from CachedStore is ")
    assert line.endswith("x as fast as the engine's at p50")
