"""The ``replay-cache`` probe: a replay answered by ``CachedStore`` from process memory beside
the same replay answered by the engine, on the same store, keys and run.

One worker replays the ``replay`` scenario's completed keys in alternating rounds: through the
store itself (one round trip per replay) and through a ``CachedStore`` over that very store,
warmed by the preload (every replay then a hit). The engine's replay is reported as the floor,
so ``x p50`` is the cached replay's share of it and ``speedup_p50`` in the notes its inverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.cached import CachedStore
from idemstore.bench.results import Measurement
from idemstore.bench.scenarios import REPLAY_KEYS, merge, rounds_of, run_store

if TYPE_CHECKING:
    from idemstore.bench.results import Timing
    from idemstore.bench.scenarios import Load
    from idemstore.protocol import IdempotencyStore

__all__ = ["ENGINE_REPLAY", "run_replay_cache"]

ENGINE_REPLAY = "engine replay"


async def run_replay_cache(
    store: IdempotencyStore, load: Load, prefix: str, backend: str
) -> Measurement:
    """The probe on one backend's open ``store`` (left open: the bench closes it)."""
    # Room for every replayed key and the warm-up keys: the probe times hits, not evictions
    # (a cycle over one key more than an LRU holds misses every time).
    cache = CachedStore(store, max_entries=2 * REPLAY_KEYS)
    engine: list[Timing] = []
    cached: list[Timing] = []
    for r, part in enumerate(rounds_of(load)):
        # The same prefix every round: the same completed keys, written once by the first
        # round's preload; the cached side's preload reads them into the cache.
        sides: list[tuple[list[Timing], IdempotencyStore]] = [(engine, store), (cached, cache)]
        for timings, replaying in sides if r % 2 == 0 else reversed(sides):
            timings.append(await run_store(replaying, "replay", part, prefix))
    subject, floor = merge(cached), merge(engine)
    notes: dict[str, float | int] = {"hits": cache.cache_info().hits}
    ours, theirs = subject.latency_ms()["p50"], floor.latency_ms()["p50"]
    if ours and theirs:
        notes["speedup_p50"] = theirs / ours
    return Measurement.of_one_caller(
        backend, "replay-cache", subject, floor, ENGINE_REPLAY, notes=notes
    )
