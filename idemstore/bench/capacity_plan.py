"""The capacity and cost model behind ``idemstore plan``: what a workload needs of each engine.

A workload is ``rps`` keyed requests a second, of which ``retry_rate`` are retries of a key
already completed, records kept for ``retention`` seconds, responses of ``response_bytes``.
In a steady state:

- new keys a second = rps x (1 - retry_rate); replays a second = rps x retry_rate;
- records held = new keys a second x retention (each key lives for its retention, then its
  engine's expiry or the sweeper removes it, as many a second as arrive);
- a new key is two writes (``reserve``, then ``complete``), a replay one read (a ``reserve``
  that finds the completed record), an expiry one delete;
- what the engine holds, and what each call costs it (round trips, transactions, WAL, server
  CPU, sweep rate, DynamoDB item size), comes from ``measured_costs``: a committed run of the
  ``cost`` bench scenario, never from a guess. Prices and the few assumptions that are not
  measurements (a Redis shard's memory, the CPU share a shard may use) are data here, each
  overridable.

Where an engine stops being the right choice is said per engine, from the same figures.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from idemstore.bench.dynamodb_units import STORAGE_OVERHEAD_BYTES, write_units
from idemstore.bench.measured_costs import MEASURED, SOURCE, EngineCosts

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DYNAMODB_PRICES",
    "REDIS_ASSUMPTIONS",
    "DynamoDBPrices",
    "EnginePlan",
    "RedisAssumptions",
    "Workload",
    "held_bytes",
    "parse_duration",
    "plan",
    "render",
    "with_overrides",
]

HOURS_PER_MONTH = 730  # AWS's billing month
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
# DynamoDB's largest item: a completed record must fit whole (docs/backends/dynamodb.md).
DYNAMODB_ITEM_LIMIT = 400 * 1024
# PostgreSQL: past this share of one sweeper's measured delete rate, deleting row by row is
# the wrong tool (the sweeper never rests, and autovacuum must clean up after it just as fast).
SWEEP_SHARE_LIMIT = 0.5
# SQLite: past this share of one writer's measured rate, callers queue on the write lock.
SQLITE_WRITER_SHARE_LIMIT = 0.5


@dataclass(frozen=True, slots=True)
class DynamoDBPrices:
    """DynamoDB list prices, in US dollars, for one region and table class, as of a date."""

    region: str = "us-east-1"
    as_of: str = "2024-11-01"  # the on-demand price cut; unchanged at the time of writing
    table_class: str = "Standard"
    per_million_write_request_units: float = 0.625
    per_million_read_request_units: float = 0.125
    per_wcu_hour: float = 0.00065
    per_rcu_hour: float = 0.00013
    per_gb_month: float = 0.25
    # Provisioned capacity is bought for the peak: auto scaling's default target utilisation.
    provisioned_utilisation: float = 0.7


DYNAMODB_PRICES = DynamoDBPrices()


@dataclass(frozen=True, slots=True)
class RedisAssumptions:
    """What sizing a Redis Cluster needs besides the measurements.

    ``calls_per_core``: requests a second one Redis core serves; ``None`` takes it from the
    measured server CPU per call (``measured_costs``). ``shard_memory_bytes``: memory one
    shard may fill with records. ``cpu_share``: the part of its core a shard may spend.
    """

    calls_per_core: float | None = None
    shard_memory_bytes: float = 25e9
    cpu_share: float = 0.5


REDIS_ASSUMPTIONS = RedisAssumptions()


@dataclass(frozen=True, slots=True)
class Workload:
    rps: float
    retention: float
    response_bytes: int
    retry_rate: float

    def __post_init__(self) -> None:
        if self.rps <= 0 or self.retention <= 0 or self.response_bytes < 0:
            raise ValueError("rps and retention must be positive, response bytes at least 0")
        if not 0 <= self.retry_rate < 1:
            raise ValueError(f"retry rate is a fraction from 0 to below 1, not {self.retry_rate}")

    @property
    def new_per_second(self) -> float:
        return self.rps * (1 - self.retry_rate)

    @property
    def replays_per_second(self) -> float:
        return self.rps * self.retry_rate

    @property
    def records(self) -> float:
        return self.new_per_second * self.retention


@dataclass(slots=True)
class EnginePlan:
    """One engine's figures for a workload, as (label, value) rows, and its verdict."""

    engine: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    verdict: str = ""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``24h``, ``7d`` or ``2w``."""
    match = _DURATION.match(text.lower())
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 3600, 30m, 24h, 7d)")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def held_bytes(workload: Workload, engine: str) -> float:
    """What ``engine`` holds for the workload's records: records x the measured bytes of one
    record at its response size (DynamoDB: the items, without the 100 B billed beside each)."""
    return workload.records * MEASURED[engine].record_bytes.at(workload.response_bytes)


def _common_rows(w: Workload, costs: EngineCosts) -> list[tuple[str, str]]:
    held = w.records * costs.record_bytes.at(w.response_bytes)
    rows = [
        ("records held", _count(w.records)),
        (
            "held",
            f"{_bytes(held)}: {costs.record_bytes.at(w.response_bytes):.0f} B/record,"
            f" {costs.holds}",
        ),
        ("writes/s", f"{_count(2 * w.new_per_second)} (reserve + complete per new key)"),
        ("reads/s", f"{_count(w.replays_per_second)} (one per replay)"),
        ("expiries/s", _count(w.new_per_second)),
    ]
    if costs.round_trips_new is not None and costs.round_trips_replay is not None:
        trips = w.new_per_second * costs.round_trips_new
        trips += w.replays_per_second * costs.round_trips_replay
        rows.append(("round trips/s", _count(trips)))
    return rows


def _server_cpu(w: Workload, costs: EngineCosts) -> float | None:
    if costs.cpu_new is None or costs.cpu_replay is None:
        return None
    return w.new_per_second * costs.cpu_new + w.replays_per_second * costs.cpu_replay


def _redis(w: Workload, costs: EngineCosts, redis: RedisAssumptions) -> EnginePlan:
    result = EnginePlan("redis", _common_rows(w, costs))
    per_request = _server_cpu(w, costs)
    if redis.calls_per_core is not None:
        per_core = redis.calls_per_core
        source = "--redis-calls-per-core"
    elif per_request is not None:
        per_core = w.rps / per_request
        source = f"measured server CPU per call ({SOURCE.date})"
    else:
        result.verdict = "no per-core throughput: give --redis-calls-per-core"
        return result
    held = w.records * costs.record_bytes.at(w.response_bytes)
    for_throughput = math.ceil(w.rps / (per_core * redis.cpu_share))
    for_memory = math.ceil(held / redis.shard_memory_bytes)
    shards = max(for_throughput, for_memory)
    result.rows += [
        ("requests/s per core", f"{_count(per_core)} (from {source})"),
        (
            "shards",
            f"{shards} ({for_throughput} for throughput at {redis.cpu_share:.0%} of a core,"
            f" {for_memory} for {_bytes(redis.shard_memory_bytes)} of records each)",
        ),
    ]
    if shards == 1:
        result.verdict = "one server (with a replica) holds it"
    else:
        driver = "memory" if for_memory >= for_throughput else "throughput"
        result.verdict = (
            f"needs Redis Cluster ({shards} shards, sized by {driver}); when memory sizes it,"
            " records held on disk (DynamoDB, PostgreSQL) cost less"
        )
    return result


def _postgres(w: Workload, costs: EngineCosts) -> EnginePlan:
    result = EnginePlan("postgres", _common_rows(w, costs))
    if costs.transactions_new is not None and costs.transactions_replay is not None:
        transactions = w.new_per_second * costs.transactions_new
        transactions += w.replays_per_second * costs.transactions_replay
        result.rows.append(("transactions/s", _count(transactions)))
    if costs.wal_new is not None:
        wal = w.new_per_second * costs.wal_new.at(w.response_bytes)
        wal += w.replays_per_second * (costs.wal_replay or 0.0)
        result.rows.append(("WAL written", f"{_bytes(wal)}/s, {_bytes(wal * 86400)}/day"))
    cpu = _server_cpu(w, costs)
    if cpu is not None:
        result.rows.append(("server CPU", f"{cpu:.2g} cores busy (measured per call)"))
    deletes = w.new_per_second
    if costs.sweep_rows_per_second is None:
        result.verdict = "no sweep rate measured"
        return result
    share = deletes / costs.sweep_rows_per_second
    result.rows.append(
        (
            "sweep",
            f"{_count(deletes)} rows/s to delete; one sweeper removes"
            f" {_count(costs.sweep_rows_per_second)}/s (measured): {share:.0%} busy",
        )
    )
    if share > SWEEP_SHARE_LIMIT:
        result.verdict = (
            f"expiry outruns row-by-row deletes ({share:.0%} of a sweeper): partition the"
            " records by expiry time and drop whole partitions (idemstore's table is not"
            " partitioned), or use Redis or DynamoDB, whose expiry costs no delete statements"
        )
    else:
        result.verdict = "one primary with the sweeper keeps up"
    return result


def _dynamodb(w: Workload, costs: EngineCosts, prices: DynamoDBPrices) -> EnginePlan:
    result = EnginePlan("dynamodb", _common_rows(w, costs))
    if costs.in_progress_item_bytes is None:
        result.verdict = "no item size measured"
        return result
    item = costs.record_bytes.at(w.response_bytes)
    started = costs.in_progress_item_bytes
    units_new = write_units(0, round(started)) + write_units(round(started), round(item))
    units_replay = write_units(round(item))  # a reserve whose condition fails: billed too
    wcu = w.new_per_second * units_new + w.replays_per_second * units_replay
    storage_gb = w.records * (item + STORAGE_OVERHEAD_BYTES) / 1e9
    on_demand = wcu * SECONDS_PER_MONTH * prices.per_million_write_request_units / 1e6
    provisioned = wcu / prices.provisioned_utilisation * HOURS_PER_MONTH * prices.per_wcu_hour
    storage = storage_gb * prices.per_gb_month
    result.rows += [
        (
            "write units/s",
            f"{_count(wcu)} ({units_new} per new key, {units_replay} per replay: a failed"
            " conditional write is billed; no read units)",
        ),
        ("storage", f"{_bytes(storage_gb * 1e9)} (item + 100 B each), ${storage:,.0f}/month"),
        ("on-demand", f"${on_demand + storage:,.0f}/month"),
        (
            "provisioned",
            f"${provisioned + storage:,.0f}/month ({_count(wcu / prices.provisioned_utilisation)}"
            f" WCU at {prices.provisioned_utilisation:.0%} use)",
        ),
        ("prices", f"{prices.region} {prices.table_class}, list prices of {prices.as_of}"),
    ]
    if item + STORAGE_OVERHEAD_BYTES > DYNAMODB_ITEM_LIMIT:
        result.verdict = "responses this large do not fit a 400 KB item"
    else:
        cheaper = "provisioned" if provisioned < on_demand else "on-demand"
        result.verdict = f"scales without shards; cost grows with writes ({cheaper} is cheaper)"
    return result


def _sqlite(w: Workload, costs: EngineCosts) -> EnginePlan:
    result = EnginePlan("sqlite", _common_rows(w, costs))
    if costs.new_call_seconds is None:
        return result
    ceiling = 1 / costs.new_call_seconds
    share = w.new_per_second / ceiling
    result.rows.append(
        ("one writer", f"{_count(ceiling)} new keys/s (measured p50): {share:.0%} busy")
    )
    if share > SQLITE_WRITER_SHARE_LIMIT:
        result.verdict = "one file's single writer cannot keep up: use PostgreSQL or Redis"
    else:
        result.verdict = "one host, one file: fine while every caller runs on that host"
    return result


def _memory(w: Workload, costs: EngineCosts) -> EnginePlan:
    result = EnginePlan("memory", _common_rows(w, costs))
    result.verdict = "one process only, records lost on restart: for tests and single workers"
    return result


def plan(
    workload: Workload,
    engines: Sequence[str] | None = None,
    *,
    prices: DynamoDBPrices = DYNAMODB_PRICES,
    redis: RedisAssumptions = REDIS_ASSUMPTIONS,
) -> list[EnginePlan]:
    """The plan of ``workload`` on each engine of ``engines`` (default: every measured one)."""
    chosen = list(MEASURED) if not engines else list(engines)
    unknown = [name for name in chosen if name not in MEASURED]
    if unknown:
        raise ValueError(
            f"no measured costs for {', '.join(unknown)}: one of {', '.join(MEASURED)}"
        )
    plans = []
    for name in chosen:
        costs = MEASURED[name]
        if name == "redis":
            plans.append(_redis(workload, costs, redis))
        elif name == "postgres":
            plans.append(_postgres(workload, costs))
        elif name == "dynamodb":
            plans.append(_dynamodb(workload, costs, prices))
        elif name == "sqlite":
            plans.append(_sqlite(workload, costs))
        else:
            plans.append(_memory(workload, costs))
    return plans


def render(workload: Workload, plans: Sequence[EnginePlan]) -> str:
    """The plan as text: the workload, each engine's rows and verdict, and the sources."""
    lines = [
        f"workload: {_count(workload.rps)} requests/s, {workload.retry_rate:.0%} retries,"
        f" retention {workload.retention / 3600:g} h, responses of {workload.response_bytes} B:"
        f" {_count(workload.new_per_second)} new keys/s, {_count(workload.records)} records",
        "",
    ]
    for engine_plan in plans:
        lines.append(f"{engine_plan.engine}")
        width = max((len(label) for label, _ in engine_plan.rows), default=0)
        lines += [f"  {label:<{width}}  {value}" for label, value in engine_plan.rows]
        if engine_plan.verdict:
            lines.append(f"  -> {engine_plan.verdict}")
        lines.append("")
    lines.append(f"measured: {SOURCE.command} ({SOURCE.date}, {SOURCE.machine})")
    return "\n".join(lines) + "\n"


def with_overrides(prices: DynamoDBPrices, **given: float | None) -> DynamoDBPrices:
    """``prices`` with the fields given (not ``None``) replaced."""
    changes: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    return replace(prices, **changes)
