"""``idemstore plan``: the capacity model's arithmetic, DynamoDB's billing rules, the command,
and the model's storage figure checked against what real engines hold."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import pytest

from idemstore import open_store
from idemstore.bench.capacity_plan import (
    DYNAMODB_PRICES,
    RedisAssumptions,
    Workload,
    held_bytes,
    parse_duration,
    plan,
    render,
    with_overrides,
)
from idemstore.bench.dynamodb_units import item_bytes, read_units, write_units
from idemstore.bench.measured_costs import MEASURED, Curve
from idemstore.bench.scenarios import payload
from idemstore.cli import main

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore

EXAMPLE = Workload(rps=50_000, retention=86_400, response_bytes=1024, retry_rate=0.05)


def rows(engine: str, workload: Workload = EXAMPLE, **kwargs: object) -> dict[str, str]:
    (found,) = plan(workload, [engine], **kwargs)  # type: ignore[arg-type]
    return dict(found.rows)


# --- The model -----------------------------------------------------------------------------


def test_records_held_are_new_keys_a_second_times_the_retention() -> None:
    workload = Workload(rps=1000, retention=3600, response_bytes=100, retry_rate=0.25)

    assert workload.new_per_second == 750
    assert workload.replays_per_second == 250
    assert workload.records == 750 * 3600


def test_storage_is_records_times_the_measured_bytes_at_that_response_size() -> None:
    for engine, costs in MEASURED.items():
        expected = EXAMPLE.records * costs.record_bytes.at(1024)

        assert held_bytes(EXAMPLE, engine) == pytest.approx(expected)


def test_a_curve_passes_through_its_points_and_follows_the_nearest_segment_beyond() -> None:
    curve = Curve(((256, 1000.0), (1024, 2000.0), (4096, 5000.0)))

    assert curve.at(256) == 1000 and curve.at(1024) == 2000 and curve.at(4096) == 5000
    assert curve.at(640) == pytest.approx(1500)
    assert curve.at(8192) == pytest.approx(5000 + 4096 * 3000 / 3072)
    assert curve.at(0) == pytest.approx(1000 - 256 * 1000 / 768)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("24h", 86_400), ("7d", 604_800), ("1.5h", 5400)],
)
def test_retention_is_read_in_seconds_minutes_hours_days_or_weeks(
    text: str, seconds: float
) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1h", "0", "24x", "1 day"])
def test_a_retention_that_is_no_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_a_retry_rate_of_one_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match="retry rate"):
        Workload(rps=10, retention=60, response_bytes=10, retry_rate=1.0)


def test_redis_shards_follow_the_throughput_given_per_core_when_memory_fits() -> None:
    small = Workload(rps=100_000, retention=60, response_bytes=256, retry_rate=0.0)
    given = RedisAssumptions(calls_per_core=10_000, shard_memory_bytes=1e12, cpu_share=0.5)

    table = rows("redis", small, redis=given)

    assert table["shards"].startswith("20 ")  # 100k / (10k x 0.5)
    assert "--redis-calls-per-core" in table["requests/s per core"]


def test_redis_shards_follow_memory_when_records_outgrow_a_shard() -> None:
    table = rows("redis", redis=RedisAssumptions(shard_memory_bytes=25e9))
    needed = math.ceil(held_bytes(EXAMPLE, "redis") / 25e9)

    assert table["shards"].startswith(f"{needed} ")
    assert "measured server CPU per call" in table["requests/s per core"]


def test_postgres_says_to_partition_when_expiry_outruns_half_a_sweeper() -> None:
    rate = MEASURED["postgres"].sweep_rows_per_second
    assert rate is not None
    slow = Workload(rps=rate * 0.4, retention=3600, response_bytes=256, retry_rate=0.0)
    fast = Workload(rps=rate * 0.6, retention=3600, response_bytes=256, retry_rate=0.0)

    (calm,) = plan(slow, ["postgres"])
    (busy,) = plan(fast, ["postgres"])

    assert "keeps up" in calm.verdict
    assert "partition" in busy.verdict


def test_dynamodb_bills_a_retry_as_a_failed_conditional_write() -> None:
    table = rows("dynamodb")
    item = MEASURED["dynamodb"].record_bytes.at(1024)  # about 1.2 KB: two write units

    assert f"{write_units(round(item))} per replay" in table["write units/s"]
    assert "no read units" in table["write units/s"]


def test_dynamodb_cost_follows_the_prices_given() -> None:
    cheap = with_overrides(DYNAMODB_PRICES, per_million_write_request_units=0.0, per_gb_month=0.0)

    assert rows("dynamodb", prices=cheap)["on-demand"] == "$0/month"
    assert rows("dynamodb")["on-demand"] != "$0/month"


def test_the_plan_names_where_its_measurements_came_from() -> None:
    text = render(EXAMPLE, plan(EXAMPLE))

    assert "idemstore bench --local --scenario cost" in text
    assert all(f"\n{engine}\n" in text for engine in MEASURED)


def test_an_engine_without_measurements_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no measured costs for cassandra"):
        plan(EXAMPLE, ["cassandra"])


def test_plan_command_prints_every_engine_for_the_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--rps", "50000", "--retention", "24h", "--response-bytes", "1024"]

    assert main([*argv, "--retry-rate", "0.05"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("workload: 50k requests/s, 5% retries, retention 24 h")
    assert "4.1G records" in out and "shards" in out and "on-demand" in out


def test_plan_command_refuses_an_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--rps", "10", "--engine", "cassandra"]) == 2
    assert "no measured costs for cassandra" in capsys.readouterr().err


# --- DynamoDB's billing rules -----------------------------------------------------------------


def test_item_size_counts_names_and_values_by_aws_rules() -> None:
    item = {
        "pk": {"S": "abc"},  # 2 + 3
        "n": {"N": "123.4500"},  # 1 + (1 + ceil(5 / 2)): trailing zeros do not count
        "b": {"B": b"\x00\x01"},  # 1 + 2
        "ok": {"BOOL": True},  # 2 + 1
        "m": {"M": {"x": {"S": "yz"}}},  # 1 + 3 + (1 + 2 + 1)
    }

    assert item_bytes(item) == 5 + 5 + 3 + 3 + 8


def test_a_write_takes_a_unit_per_started_kilobyte_of_the_larger_item() -> None:
    assert write_units(0, 1) == 1
    assert write_units(1024) == 1 and write_units(1025) == 2
    assert write_units(3000, 100) == 3  # an update: the larger of before and after


def test_a_read_takes_a_unit_per_started_4_kb_and_half_when_eventually_consistent() -> None:
    assert read_units(4096) == 1 and read_units(4097) == 2
    assert read_units(4097, consistent=False) == 1.0


# --- Checked against what the engines hold -------------------------------------------------

CHECKED_RECORDS = 1500
# Between two measured sizes, so the check covers the model's interpolation too.
CHECKED_RESPONSE = 800


async def write_records(store: IdempotencyStore, count: int, size: int) -> list[str]:
    keys = [f"capacity-{j}" for j in range(count)]
    response = payload(size)
    for key in keys:
        reservation = await store.reserve(key, "fp" * 32, scope="", lease_ttl=60, retention=3600)
        assert reservation.lease is not None
        await store.complete(reservation.lease, response[:-1] + response[-1:])
    return keys


def planned_bytes(engine: str) -> float:
    workload = Workload(
        rps=CHECKED_RECORDS, retention=1, response_bytes=CHECKED_RESPONSE, retry_rate=0
    )
    return held_bytes(workload, engine)


async def test_plan_holds_within_a_fifth_of_the_memory_redis_reports_for_its_keys(
    redis_store_url: str,
) -> None:
    from idemstore.bench.engine_meters import RedisMeter, meter_for

    async with open_store(redis_store_url) as store:
        keys = await write_records(store, CHECKED_RECORDS, CHECKED_RESPONSE)
    meter = meter_for(redis_store_url)
    assert isinstance(meter, RedisMeter)
    await meter.open()
    try:
        held = await meter.key_bytes("", keys)
    finally:
        await meter.close()

    print(f"redis holds {held} B, the plan says {planned_bytes('redis'):.0f} B")
    assert held == pytest.approx(planned_bytes("redis"), rel=0.2)


async def test_plan_holds_within_a_fifth_of_the_postgres_table_size(
    postgres_store_url: str,
) -> None:
    from idemstore.bench.engine_meters import meter_for

    meter = meter_for(postgres_store_url)
    await meter.open()
    try:
        before = (await meter.held())["bytes"]
        async with open_store(postgres_store_url) as store:
            await write_records(store, CHECKED_RECORDS, CHECKED_RESPONSE)
        held = (await meter.held())["bytes"] - before
    finally:
        await meter.close()

    print(f"postgres holds {held} B, the plan says {planned_bytes('postgres'):.0f} B")
    assert held == pytest.approx(planned_bytes("postgres"), rel=0.2)


def test_the_checked_response_size_lies_between_two_measured_ones() -> None:
    sizes = [size for size, _ in MEASURED["redis"].record_bytes.points]

    assert any(a < CHECKED_RESPONSE < b for a, b in itertools.pairwise(sizes))
