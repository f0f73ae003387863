"""The ``sync`` bench scenario: what ``idemstore.sync`` adds to a keyed call.

For each target store, one worker runs the same calls two ways, in interleaved rounds so that
drift hits both alike: ``Idempotency.run`` awaited on the bench's event loop (the floor), and
``idemstore.sync.Idempotency.run`` called from a plain thread (the subject: a hop to the
runner's loop thread, the async path there, and a hop back to run the work in the calling
thread). Half the calls are fresh keys, half replays of them. ``added_p50_ms`` is the
per-call overhead of the synchronous door.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from idemstore.backends.urls import open_store, redact_url
from idemstore.bench.results import Measurement, Timing, on_each_target
from idemstore.runner import Idempotency
from idemstore.sync import Idempotency as SyncIdempotency

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.bench.results import Unavailable
    from idemstore.bench.runner import Target
    from idemstore.bench.scenarios import Load

__all__ = ["run_sync"]

ROUNDS = 5
FLOOR = "async runner"
SCOPE = "idemstore-bench"
RETENTION = 3600.0
FINGERPRINT = "sync-bench"
RESPONSE = b"x" * 256


def _keys(prefix: str, count: int) -> list[str]:
    # Every key runs once, then replays once.
    return [f"{prefix}{j // 2}" for j in range(count)]


async def _async_round(url: str, keys: list[str], timing: Timing) -> None:
    async with open_store(url) as store:
        runner = Idempotency(store, retention=RETENTION)

        async def work() -> bytes:
            return RESPONSE

        clock = time.perf_counter_ns
        started = time.perf_counter()
        for key in keys:
            begun = clock()
            result = await runner.run(key, FINGERPRINT, work, scope=SCOPE)
            timing.latencies_ns.append(clock() - begun)
            timing.executions += not result.replayed
        timing.seconds += time.perf_counter() - started
        timing.unique_keys += len(set(keys))


def _sync_round(runner: SyncIdempotency, keys: list[str], timing: Timing) -> None:
    def work() -> bytes:
        return RESPONSE

    clock = time.perf_counter_ns
    started = time.perf_counter()
    for key in keys:
        begun = clock()
        result = runner.run(key, FINGERPRINT, work, scope=SCOPE)
        timing.latencies_ns.append(clock() - begun)
        timing.executions += not result.replayed
    timing.seconds += time.perf_counter() - started
    timing.unique_keys += len(set(keys))


async def _one_target(target: Target, load: Load, prefix: str) -> Measurement:
    per_round = max(2, (load.ops or 2000) // ROUNDS)
    floor, subject = Timing(), Timing()
    # The sync runner opens its own store on its own loop, as an application would.
    runner = await asyncio.to_thread(SyncIdempotency, target.url, retention=RETENTION)
    try:
        for n in range(ROUNDS):
            round_prefix = f"{prefix}{n}-"
            await _async_round(target.url, _keys(f"{round_prefix}a:", per_round), floor)
            # From a plain thread, as a WSGI worker thread calls it.
            await asyncio.to_thread(
                _sync_round, runner, _keys(f"{round_prefix}s:", per_round), subject
            )
    finally:
        await asyncio.to_thread(runner.close)
    notes: dict[str, Any] = {}
    ours, theirs = subject.latency_ms()["p50"], floor.latency_ms()["p50"]
    if ours is not None and theirs is not None:
        notes["added_p50_ms"] = ours - theirs
    return Measurement.of_one_caller(
        target.name, "sync", subject, floor, FLOOR, url=redact_url(target.url), notes=notes
    )


async def run_sync(
    targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """The scenario on every target; a target that fails is ``Unavailable``."""
    return await on_each_target(targets, "sync", lambda target: _one_target(target, load, prefix))
