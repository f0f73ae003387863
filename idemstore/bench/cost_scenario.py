"""The ``cost`` bench scenario: what one record and one call cost each engine.

On each target, one worker writes ``records`` new keys (``reserve`` + ``complete``, as
``Idempotency.run`` does) with responses of each size in ``RESPONSE_SIZES``, then replays each
of them once, while the engine's meter (``engine_meters``) reads what the engine holds and
what it did. Per record: the bytes the engine holds at each size (the plan interpolates
between them: storage is not linear across a TOAST threshold or an encoding change). Per new
call and per replay, where the engine shows it: round trips (Redis: read events), commands,
transactions (PostgreSQL), WAL bytes, network bytes and server CPU seconds. A phase of no
calls, read the same way, is subtracted: what the meter and the store's connecting cost.

The store is closed after each phase and opened for the next one (PostgreSQL publishes a
session's transaction count when it ends), except the memory store, whose records would go
with it. DynamoDB is sized by AWS's rules instead (``dynamodb_units``): its items read back,
and the capacity units each call takes from them.

The plan (``idemstore plan``) reads its inputs from a committed run of this scenario
(``measured_costs``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import TYPE_CHECKING, Any

from idemstore.backends.registry import engine_for_url
from idemstore.backends.urls import open_store, redact_url
from idemstore.bench.dynamodb_units import STORAGE_OVERHEAD_BYTES, write_units
from idemstore.bench.engine_meters import DynamoDBMeter, RedisMeter, meter_for
from idemstore.bench.results import Measurement, Timing, on_each_target
from idemstore.bench.scenarios import FINGERPRINT, LEASE_TTL, RETENTION, SCOPE, payload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from idemstore.bench.engine_meters import Meter
    from idemstore.bench.results import Unavailable
    from idemstore.bench.runner import Target
    from idemstore.bench.scenarios import Load
    from idemstore.protocol import IdempotencyStore

__all__ = ["RESPONSE_SIZES", "cost_note", "run_cost"]

# Response sizes: a small one, one past what Redis keeps in a listpack and DynamoDB
# compresses from, and one PostgreSQL moves out of the row (TOAST, from about 2 KB).
RESPONSE_SIZES = (256, 1024, 4096)
# New keys per response size, at most (a smaller --ops lowers it): enough pages that an 8 KB
# page of PostgreSQL or a 4 KB page of SQLite is a small part of the delta.
RECORDS = 400
# PostgreSQL publishes a closed session's statistics as its backend exits, just after.
STATISTICS_SETTLE = 0.3
# Calls made before anything is measured.
WARM_UP = 10
# DynamoDB: items read back to size them.
SIZED_ITEMS = 20
# The sweep phase: records live this long (seconds), and are swept this much later.
SWEEP_RETENTION = 1.0
SWEEP_GRACE = 1.5


async def _calls(count: int, call: Callable[[int], Any]) -> Timing:
    timing = Timing()
    started = time.perf_counter()
    for j in range(count):
        await timing.time_call(call(j))
    timing.seconds = time.perf_counter() - started
    return timing


async def _reserve_complete(store: IdempotencyStore, key: str, response: bytes) -> bool:
    reservation = await store.reserve(
        key, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
    )
    if reservation.lease is None:
        raise RuntimeError(f"{key} was not acquired: the keys of a cost run are new")
    # A copy per record, as each real response is its own: the memory store would otherwise
    # hold one shared object for all of them.
    await store.complete(reservation.lease, response[:-1] + response[-1:])
    return True


async def _replay(store: IdempotencyStore, key: str) -> bool:
    reservation = await store.reserve(
        key, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
    )
    if reservation.record is None or reservation.record.response is None:
        raise RuntimeError(f"{key} was not replayed")
    return False


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if name in before}


class _Engine:
    """One target's store (opened and closed by phase) and its meter."""

    def __init__(self, url: str, meter: Meter, keep_open: bool) -> None:
        self.url = url
        self.meter = meter
        self.keep_open = keep_open
        self.store: IdempotencyStore | None = None

    async def phase(
        self, count: int, call: Callable[[IdempotencyStore, int], Any]
    ) -> tuple[Timing, dict[str, float], dict[str, float]]:
        """``count`` calls; the deltas of what the engine holds and of its activity."""
        if self.store is None:
            self.store = open_store(self.url)
            await self.store.__aenter__()
        store = self.store
        held = await self.meter.held()
        before = await self.meter.activity()
        timing = await _calls(count, lambda j: call(store, j))
        if timing.errors:
            # The engine's counters moved for calls that did other work or none: what they
            # show is no call's cost, so the target is reported unavailable, with why.
            name, example = next(iter(timing.error_examples.items()))
            raise RuntimeError(f"{sum(timing.errors.values())} calls failed ({name}: {example})")
        held_after = await self.meter.held()
        if not self.keep_open:
            await self.close()
            await asyncio.sleep(STATISTICS_SETTLE)
        return timing, _delta(held_after, held), _delta(await self.meter.activity(), before)

    async def close(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            await store.close()


def _per(counters: dict[str, float], idle: dict[str, float], count: int) -> dict[str, float]:
    return {
        name: round((value - idle.get(name, 0.0)) / count, 9) for name, value in counters.items()
    }


async def _dynamodb_units(
    meter: DynamoDBMeter, engine: _Engine, keys: Sequence[str], prefix: str
) -> dict[str, float]:
    """Item sizes read back, and the units each call takes by AWS's rules: a new key's
    reserve (an update creating the in-progress item), its complete (an update to the
    completed item) and a replay (a reserve whose condition fails on the completed item)."""
    completed = statistics.mean(await meter.item_sizes(SCOPE, keys[:SIZED_ITEMS]))
    held = f"{prefix}in-progress"

    async def reserve_only(store: IdempotencyStore, _j: int) -> bool:
        await store.reserve(
            held, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
        )
        return True

    await engine.phase(1, reserve_only)
    (in_progress,) = await meter.item_sizes(SCOPE, [held])
    return {
        "item_bytes": round(completed, 1),
        "in_progress_item_bytes": float(in_progress),
        "storage_bytes": round(completed + STORAGE_OVERHEAD_BYTES, 1),
        "write_units_new": float(
            write_units(0, in_progress) + write_units(in_progress, round(completed))
        ),
        "write_units_replay": float(write_units(round(completed))),
        "read_units_replay": 0.0,
    }


async def _sweep(
    engine: _Engine, count: int, idle: dict[str, float], prefix: str
) -> dict[str, Any]:
    """What removing expired records costs: ``count`` records written with a retention of
    ``SWEEP_RETENTION``, then swept in batches of ``count`` once they expired; rows removed a
    second by one sweeper, and the engine's work per row removed."""
    keys = [f"{prefix}expiring-{j}" for j in range(count)]
    response = payload(RESPONSE_SIZES[0])

    async def short_lived(store: IdempotencyStore, j: int) -> bool:
        reservation = await store.reserve(
            keys[j], FINGERPRINT, scope=SCOPE, lease_ttl=SWEEP_RETENTION, retention=SWEEP_RETENTION
        )
        if reservation.lease is not None:
            await store.complete(reservation.lease, response)
        return True

    await engine.phase(count, short_lived)
    await asyncio.sleep(SWEEP_RETENTION + SWEEP_GRACE)
    removed = 0

    async def sweep_all(store: IdempotencyStore, _j: int) -> bool:
        nonlocal removed
        while (swept := await store.sweep(limit=count)) > 0:
            removed += swept
        return True

    timing, _, work = await engine.phase(1, sweep_all)
    if not removed:
        return {"removed": 0}
    return {
        "removed": removed,
        "rows_per_second": round(removed / timing.seconds, 1),
        "per_row": _per(work, idle, removed),
    }


async def _one_size(
    engine: _Engine, size: int, keys: Sequence[str], idle: dict[str, float], prefix: str
) -> tuple[Timing, dict[str, float], dict[str, Any]]:
    """New keys with responses of ``size`` bytes, then their replays: the fresh calls' timing,
    the bytes held per record by measure, and the notes of this size."""
    count, response, meter = len(keys), payload(size), engine.meter
    timing, held, fresh = await engine.phase(
        count, lambda store, j: _reserve_complete(store, keys[j], response)
    )
    _, _, replayed = await engine.phase(count, lambda store, j: _replay(store, keys[j]))
    notes: dict[str, Any] = {
        f"per_new_call_{size}": _per(fresh, idle, count),
        f"per_replay_{size}": _per(replayed, idle, count),
    }
    if isinstance(meter, DynamoDBMeter):
        notes[f"dynamodb_{size}"] = await _dynamodb_units(meter, engine, keys, prefix)
    elif isinstance(meter, RedisMeter):
        notes[f"key_bytes_per_record_{size}"] = round(await meter.key_bytes(SCOPE, keys) / count, 1)
    return timing, {name: value / count for name, value in held.items()}, notes


async def _one_target(target: Target, load: Load, prefix: str) -> Measurement:
    entry = engine_for_url(target.url)
    meter = meter_for(target.url)
    count = RECORDS if load.ops is None else max(1, min(RECORDS, load.ops))
    await meter.open()
    engine = _Engine(target.url, meter, keep_open=entry is not None and entry.name == "memory")
    notes: dict[str, Any] = {"records": count, "response_sizes": list(RESPONSE_SIZES)}
    subject = Timing()
    held_by_size: dict[str, dict[int, float]] = {}
    try:
        # Untimed first calls: whatever is built on first use (scripts, statements, caches)
        # is not a record's cost.
        warm = payload(RESPONSE_SIZES[0])
        await engine.phase(
            WARM_UP, lambda store, j: _reserve_complete(store, f"{prefix}warm-{j}", warm)
        )
        _, _, idle = await engine.phase(0, lambda _store, _j: None)
        for size in RESPONSE_SIZES:
            keys = [f"{prefix}{size}-{j}" for j in range(count)]
            timing, held, size_notes = await _one_size(engine, size, keys, idle, prefix)
            subject.latencies_ns += timing.latencies_ns
            subject.seconds += timing.seconds
            notes.update(size_notes)
            for name, value in held.items():
                held_by_size.setdefault(name, {})[size] = value
        if not isinstance(meter, DynamoDBMeter):  # DynamoDB's TTL deletes for free, unasked
            notes["sweep"] = await _sweep(engine, count, idle, prefix)
    finally:
        await engine.close()
        await meter.close()
    notes["bytes_per_record"] = {
        name: {str(size): round(value, 1) for size, value in by_size.items()}
        for name, by_size in held_by_size.items()
    }
    return Measurement(
        backend=target.name,
        scenario="cost",
        concurrency=1,
        subject=subject,
        url=redact_url(target.url),
        notes=notes,
    )


async def run_cost(
    targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """The scenario on every target; one without a meter, or failing, is ``Unavailable``."""
    return await on_each_target(targets, "cost", lambda target: _one_target(target, load, prefix))


def cost_note(measurement: Measurement) -> str | None:
    """One line under the table: bytes per record by response size, and what a new call
    costs the engine."""
    notes = measurement.notes
    sizes = "/".join(str(size) for size in RESPONSE_SIZES)
    parts = [f"cost {measurement.backend}:"]
    held = notes.get("bytes_per_record", {}).get("bytes")
    if held:
        parts.append(f"B/record at {sizes} B: " + "/".join(f"{v:.0f}" for v in held.values()))
    items = [i for size in RESPONSE_SIZES if (i := notes.get(f"dynamodb_{size}")) is not None]
    if items and len(items) == len(RESPONSE_SIZES):
        parts.append(f"item B at {sizes} B: " + "/".join(f"{i['item_bytes']:.0f}" for i in items))
    call = notes.get(f"per_new_call_{RESPONSE_SIZES[0]}", {})
    if "round_trips" in call:
        parts.append(f"{call['round_trips']:.1f} round trips/call")
    if "transactions" in call:
        parts.append(f"{call['transactions']:.1f} transactions/call")
    if "cpu_seconds" in call:
        parts.append(f"{call['cpu_seconds'] * 1e6:.0f} µs CPU/call")
    return " ".join(parts) if len(parts) > 1 else None
