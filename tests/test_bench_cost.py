"""The ``cost`` bench scenario: what it reads from each engine, and that it says so.

Benchmarks are not tests: nothing here asserts a timing, only that the engine's own figures
are there and add up (bytes grow with the response, a Redis replay is one round trip)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.bench import Target
from idemstore.bench.cost_scenario import RESPONSE_SIZES, cost_note, run_cost
from idemstore.bench.engine_meters import meter_for
from idemstore.bench.results import Measurement, Unavailable
from idemstore.bench.scenarios import Load

if TYPE_CHECKING:
    from pathlib import Path

LOAD = Load(concurrency=1, ops=30, duration=None, payload_bytes=64)


async def measured_on(name: str, url: str) -> Measurement:
    # New keys every run: a test measuring one engine more than once must not replay.
    prefix = f"test-cost-{name}-{uuid.uuid4().hex[:8]}-"
    (measured,) = await run_cost([Target(name, url)], LOAD, prefix)
    assert isinstance(measured, Measurement), measured
    return measured


def grows_with_the_response(notes: dict[str, Any], measure: str = "bytes") -> bool:
    held = notes["bytes_per_record"][measure]
    values = [held[str(size)] for size in RESPONSE_SIZES]
    return values == sorted(values) and values[-1] - values[0] > RESPONSE_SIZES[-1] / 2


async def test_memory_records_are_measured_in_traced_allocations() -> None:
    measured = await measured_on("memory", "memory://")

    assert measured.scenario == "cost" and measured.notes["records"] == 30
    assert grows_with_the_response(measured.notes)
    assert measured.notes["sweep"]["removed"] == 30
    assert len(measured.subject.latencies_ns) == 30 * len(RESPONSE_SIZES)


async def test_sqlite_records_are_measured_in_file_pages(tmp_path: Path) -> None:
    measured = await measured_on("sqlite", f"sqlite:///{tmp_path / 'cost.db'}")

    assert grows_with_the_response(measured.notes)
    assert measured.notes["sweep"]["rows_per_second"] > 0
    note = cost_note(measured)
    assert note is not None and note.startswith("cost sqlite: B/record at 256/1024/4096 B:")


async def test_redis_counts_two_round_trips_a_new_key_and_one_a_replay(
    redis_store_url: str,
) -> None:
    measured = await measured_on("redis", redis_store_url)
    notes = measured.notes

    for size in RESPONSE_SIZES:
        assert notes[f"per_new_call_{size}"]["round_trips"] == pytest.approx(2, abs=0.1)
        assert notes[f"per_replay_{size}"]["round_trips"] == pytest.approx(1, abs=0.1)
        assert notes[f"per_new_call_{size}"]["cpu_seconds"] > 0
        assert notes[f"key_bytes_per_record_{size}"] > size
    # used_memory moves with everything else on a shared server: MEMORY USAGE is the record's.
    assert notes["key_bytes_per_record_4096"] - notes["key_bytes_per_record_256"] > 3840


def _wal_shows_new_calls_logged_and_replays_not(notes: dict[str, Any]) -> bool:
    return all(
        notes[f"per_new_call_{size}"]["wal_bytes"] > size / 2  # logged, compressed or not
        and notes[f"per_replay_{size}"]["wal_bytes"]
        < notes[f"per_new_call_{size}"]["wal_bytes"] / 10
        for size in RESPONSE_SIZES
    )


async def test_postgres_counts_table_bytes_wal_and_transactions(
    quiet_postgres_store_url: str,
) -> None:
    # WAL is counted server-wide, hence a server of its own (the fixture says why). Even that
    # one writes WAL unasked (a checkpoint), and a burst in one run's idle or replay window
    # skews that run's WAL figures: one run of three must show them clean. The other counts
    # hold in every run.
    for run in range(3):
        notes = (await measured_on("postgres", quiet_postgres_store_url)).notes
        if run == 0:
            # Growth of the table: only the first run grows it; later ones refill the pages
            # the first run's sweep emptied, and may hold 0 bytes more.
            held = notes["bytes_per_record"]["bytes"]  # in 8 KB pages: 30 records fill a few
            assert held["4096"] > held["256"] + 3000
        for size in RESPONSE_SIZES:
            # Two (reserve, complete); the scenario's own store sessions publish their counts
            # when they end, into this delta or into the idle phase's.
            assert 1 <= notes[f"per_new_call_{size}"]["transactions"] <= 6
        assert notes["sweep"]["removed"] == 30
        if _wal_shows_new_calls_logged_and_replays_not(notes):
            break
    assert _wal_shows_new_calls_logged_and_replays_not(notes), notes


async def test_dynamodb_items_are_sized_and_billed_by_aws_rules(dynamodb_store_url: str) -> None:
    measured = await measured_on("dynamodb", dynamodb_store_url)
    small, _, large = (measured.notes[f"dynamodb_{size}"] for size in RESPONSE_SIZES)

    assert small["in_progress_item_bytes"] < small["item_bytes"] < large["item_bytes"]
    assert small["write_units_new"] == 2 and small["write_units_replay"] == 1
    assert large["write_units_replay"] == -(-int(large["item_bytes"]) // 1024)
    assert "sweep" not in measured.notes  # DynamoDB's TTL expires items unasked


async def test_a_run_whose_new_keys_are_replays_is_reported_not_measured(
    tmp_path: Path,
) -> None:
    # A second run on the same keys replays them: its engine counters are no new call's cost
    # (CI once read 0 WAL bytes per "new" call this way).
    url = f"sqlite:///{tmp_path / 'cost.db'}"
    (first,) = await run_cost([Target("sqlite", url)], LOAD, "same-keys-")
    (second,) = await run_cost([Target("sqlite", url)], LOAD, "same-keys-")

    assert isinstance(first, Measurement)
    assert isinstance(second, Unavailable) and second.scenario == "cost"
    assert "calls failed" in second.reason and "was not acquired" in second.reason


async def test_a_target_without_a_meter_is_reported_not_measured() -> None:
    (outcome,) = await run_cost([Target("memo", "sqlite:///:memory:")], LOAD, "test-")

    assert isinstance(outcome, Unavailable) and outcome.scenario == "cost"
    assert "no cost meter" in outcome.reason


def test_a_meter_is_chosen_by_the_url_engine() -> None:
    with pytest.raises(ValueError, match="no cost meter for redis\\+cluster://"):
        meter_for("redis+cluster://127.0.0.1:7000")
