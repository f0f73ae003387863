"""Probe scenarios: what a store costs besides its latency, measured by ``idemstore bench``.

- ``commands``: engine commands per ``reserve`` + ``complete`` (Redis: ``INFO commandstats``
  deltas, top-level and inside scripts) for a fresh key and for a replay;
- ``wake``: how soon a ``wait`` returns after ``complete`` on the same key (from the call to
  ``complete`` to the waiter's return), on every backend;
- ``replay-writes``: what replays write (PostgreSQL: whether the replayed row was rewritten,
  and the WAL bytes the server wrote meanwhile, across many replays of one completed key); a
  correct store writes nothing;
- ``middleware``: per-request cost of ``IdempotencyMiddleware`` over the same bare ASGI app
  (memory store), for a new key and for a replay, interleaved request by request; and its
  streamed cases (``stream_probes.py``): recording a 1 MB streamed response against passing
  it through, and a following retry's first-byte latency.

An engine-specific probe reads its counters through the engine's floor (``floors.py``), never
through the store's private state; on an engine without the counters it records nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from idemstore.bench.replay_cache_scenario import run_replay_cache
from idemstore.bench.results import Measurement, Timing, Unavailable
from idemstore.bench.scenarios import (
    FINGERPRINT,
    LEASE_TTL,
    RETENTION,
    SCOPE,
    TARGET_PROBES,
    Load,
    payload,
)
from idemstore.bench.stream_probes import run_stream_probes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from idemstore.bench.floors import Floor
    from idemstore.protocol import IdempotencyStore

__all__ = ["TARGET_PROBES", "WAKE_TIMEOUT", "run_middleware", "run_target_probe"]

# commands / replay-writes: operations counted (counters are read once before, once after).
COUNTED_OPS = 200
# wake: how long the waiter sleeps in wait() before complete is called, and its timeout.
WAKE_HEAD_START = 0.005
WAKE_TIMEOUT = 10.0
WAKE_SAMPLES = 50
# Samples per measurement of the probes that time single operations, at most.
MAX_PROBE_SAMPLES = 2000


def _samples(load: Load, cap: int) -> int:
    """How many samples a probe takes: the run's ``ops`` capped, or ``cap`` in duration mode."""
    return cap if load.ops is None else max(1, min(cap, load.ops))


async def _reserve_complete(store: IdempotencyStore, key: str, response: bytes) -> bool:
    reservation = await store.reserve(
        key, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
    )
    if reservation.lease is None:
        return False
    await store.complete(reservation.lease, response)
    return True


async def _timed_loop(count: int, op: Callable[[int], Awaitable[bool]]) -> Timing:
    timing = Timing()
    started = time.perf_counter()
    for j in range(count):
        await timing.time_call(op(j))
    timing.seconds = time.perf_counter() - started
    return timing


async def _counted(
    read: Callable[[], Awaitable[dict[str, Any]]], count: int, op: Callable[[int], Awaitable[bool]]
) -> tuple[dict[str, Any], Timing, dict[str, Any]]:
    """The engine's counters (``read``) before and after ``count`` timed operations."""
    before = await read()
    timing = await _timed_loop(count, op)
    return before, timing, await read()


async def _commands(
    store: IdempotencyStore, floor: Any, load: Load, prefix: str, backend: str
) -> list[Measurement]:
    response = payload(load.payload_bytes)
    count = _samples(load, COUNTED_OPS)
    measured = []
    await _reserve_complete(store, f"{prefix}replayed", response)
    for case in ("fresh", "replay"):

        def op(j: int, case: str = case) -> Awaitable[bool]:
            key = f"{prefix}fresh-{j}" if case == "fresh" else f"{prefix}replayed"
            return _reserve_complete(store, key, response)

        before, timing, after = await _counted(floor.command_counts, count, op)
        per_op = {
            name: round((after.get(name, 0) - before.get(name, 0)) / count, 2)
            for name in sorted(set(after) | set(before))
            if after.get(name, 0) != before.get(name, 0)
        }
        timing.unique_keys = count if case == "fresh" else 0
        measured.append(
            Measurement(
                backend=backend,
                scenario="commands",
                concurrency=1,
                subject=timing,
                expected_executions=timing.unique_keys,
                notes={"case": case, "ops": count, "commands_per_op": per_op},
            )
        )
    return measured


async def _replay_writes(
    store: IdempotencyStore, floor: Any, load: Load, prefix: str, backend: str
) -> list[Measurement]:
    response = payload(load.payload_bytes)
    count = _samples(load, COUNTED_OPS)
    key = f"{prefix}replayed"
    await _reserve_complete(store, key, response)
    before, timing, after = await _counted(
        lambda: floor.write_counters(SCOPE, key),
        count,
        lambda _j: _reserve_complete(store, key, response),
    )
    # The WAL position is the whole server's (autovacuum after the scenarios writes too): the
    # same time without replays shows what the server writes by itself.
    await asyncio.sleep(timing.seconds)
    idle = await floor.write_counters(SCOPE, key)
    delta = {
        "wal_bytes": after["wal_bytes"] - before["wal_bytes"],
        "wal_bytes_idle": idle["wal_bytes"] - after["wal_bytes"],
        "row_rewritten": after["row_version"] != before["row_version"],
    }
    return [
        Measurement(
            backend=backend,
            scenario="replay-writes",
            concurrency=1,
            subject=timing,
            expected_executions=0,
            notes={"replays": count, **delta},
        )
    ]


async def _wake(store: IdempotencyStore, load: Load, prefix: str, backend: str) -> Measurement:
    timing = Timing()
    response = payload(load.payload_bytes)
    started = time.perf_counter()
    for j in range(_samples(load, WAKE_SAMPLES)):
        key = f"{prefix}wake-{j}"
        reservation = await store.reserve(
            key, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
        )
        if reservation.lease is None:
            timing.record_error(RuntimeError(f"{key} was not acquired"))
            continue
        waiter = asyncio.ensure_future(store.wait(key, scope=SCOPE, timeout=WAKE_TIMEOUT))
        woke_at = 0

        def woke(_task: asyncio.Future[Any]) -> None:
            nonlocal woke_at
            woke_at = time.perf_counter_ns()

        waiter.add_done_callback(woke)
        await asyncio.sleep(WAKE_HEAD_START)  # the waiter reads the record and sleeps
        called = time.perf_counter_ns()
        await store.complete(reservation.lease, response)
        try:
            record = await waiter
        except Exception as exc:
            timing.record_error(exc)
            continue
        if record is None or record.response is None:
            timing.record_error(TimeoutError(f"wait on {key} returned before the response"))
            continue
        timing.latencies_ns.append(woke_at - called)
    timing.seconds = time.perf_counter() - started
    return Measurement(
        backend=backend,
        scenario="wake",
        concurrency=1,
        subject=timing,
        notes={"head_start_ms": WAKE_HEAD_START * 1000},
    )


async def run_target_probe(
    probe: str,
    store: IdempotencyStore,
    floor: Floor | None,
    load: Load,
    prefix: str,
    backend: str,
) -> list[Measurement]:
    """``probe`` on one backend; empty when its engine has no such counters."""
    if probe == "wake":
        return [await _wake(store, load, prefix, backend)]
    if probe == "commands" and hasattr(floor, "command_counts"):
        return await _commands(store, floor, load, prefix, backend)
    if probe == "replay-writes" and hasattr(floor, "write_counters"):
        return await _replay_writes(store, floor, load, prefix, backend)
    if probe == "replay-cache":
        return [await run_replay_cache(store, load, prefix, backend)]
    return []


# -- middleware ------------------------------------------------------------------------------

MIDDLEWARE_STORE = "memory://"
MIDDLEWARE_BODY = json.dumps({"sku": "A1", "qty": 2, "note": "x" * 200}).encode()


async def _bare_app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """An ASGI endpoint that reads its body and answers 201 with a small JSON document."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b'{"id": 1, "bytes": ' + str(len(body)).encode() + b"}"
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def _call(app: Any, key: str | None) -> int:
    """One POST through ``app`` in-process, as a server would make it; the status."""
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer bench")]
    if key is not None:
        headers.append((b"idempotency-key", f'"{key}"'.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders",
        "raw_path": b"/orders",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)  # a disconnect never comes during a benchmark
        sent = True
        return {"type": "http.request", "body": MIDDLEWARE_BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def run_middleware(load: Load, prefix: str) -> list[Measurement] | Unavailable:
    """``IdempotencyMiddleware`` (memory store) against the bare app, request by request."""
    from idemstore.backends.urls import open_store
    from idemstore.http.asgi import IdempotencyMiddleware

    count = _samples(load, MAX_PROBE_SAMPLES)
    async with open_store(MIDDLEWARE_STORE) as store:
        wrapped = IdempotencyMiddleware(_bare_app, store=store)
        replayed = f"{prefix}replayed"
        if await _call(wrapped, replayed) != 201:
            return Unavailable("asgi", "the first keyed request failed", "middleware")
        cases: dict[str, Callable[[int], Awaitable[int]]] = {
            "bare app": lambda _j: _call(_bare_app, None),
            "no key": lambda _j: _call(wrapped, None),
            "new key": lambda j: _call(wrapped, f"{prefix}{j}"),
            "replay": lambda _j: _call(wrapped, replayed),
        }
        timings = {name: Timing() for name in cases}
        for j in range(-min(100, count), 0):  # warm-up, untimed
            for one in cases.values():
                await one(j - count)
        clock = time.perf_counter_ns
        # Interleaved request by request: load from elsewhere falls on every case alike.
        for j in range(count):
            for name, one in cases.items():
                begun = clock()
                status = await one(j)
                elapsed = clock() - begun
                timing = timings[name]
                timing.seconds += elapsed / 1e9
                if status in (200, 201):
                    timing.latencies_ns.append(elapsed)
                else:
                    timing.record_error(RuntimeError(f"status {status}"))
    floor = timings.pop("bare app")
    streamed = await run_stream_probes(load, prefix)
    return [
        Measurement(
            backend=f"asgi {name}",
            scenario="middleware",
            concurrency=1,
            subject=timing,
            floor=floor,
            floor_name="the same ASGI app without the middleware",
            url=MIDDLEWARE_STORE,
            notes={"case": name},
        )
        for name, timing in timings.items()
    ] + streamed
