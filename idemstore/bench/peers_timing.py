"""The ``peers`` scenario's timed loops: every side called by N concurrent callers.

A side is one library behind one door. At concurrency N an async side is called from N tasks
on the bench's loop, a sync side from N threads of a pool of its own (asyncio's default
executor has too few threads for 32 callers on a small machine), as N web workers would call
it. Each caller has keys of its own: first calls on fresh keys, then the replays of all those
keys spread over the same N callers. The work counts its executions under a lock, so a peer
that runs it twice for a key shows, whatever the concurrency.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from idemstore.bench.results import Timing
from idemstore.bench.scenarios import keep_going, merge, rounds_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from idemstore.bench.scenarios import Load

__all__ = ["Door", "Executions", "Side", "Timed", "timed_rounds"]

Door = Literal["async", "sync"]


class Executions:
    """How many times a side's work ran; safe to count from many threads."""

    __slots__ = ("_lock", "count")

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        # += on an attribute is a read then a write: two threads could lose one without this.
        with self._lock:
            self.count += 1


@dataclass(slots=True)
class Side:
    """One library on one engine through one door: ``call(order_id)`` runs the decorated
    function (a coroutine for the async door, a plain call for the sync one)."""

    label: str
    door: Door
    call: Callable[[str], Any]
    close: Callable[[], Awaitable[None]]
    executions: Executions = field(default_factory=Executions)


@dataclass(slots=True)
class Timed:
    """One side's rounds at one concurrency."""

    first: list[Timing] = field(default_factory=list)
    replay: list[Timing] = field(default_factory=list)


def _keys(keys: list[str], deadline: float | None, prefix: str) -> Iterator[str]:
    """``keys`` in turn or, with a ``deadline``, fresh keys from ``prefix`` until then (one at
    least), each appended to ``keys`` for the replays."""
    if deadline is None:
        yield from keys
        return
    while not keys or keep_going(len(keys), None, deadline):
        keys.append(f"{prefix}{len(keys)}")
        yield keys[-1]


def _sync_caller(
    call: Callable[[str], Any], keys: list[str], deadline: float | None, prefix: str
) -> Timing:
    """One thread's calls, timed."""
    timing = Timing()
    clock = time.perf_counter_ns
    for key in _keys(keys, deadline, prefix):
        begun = clock()
        try:
            call(key)
        except Exception as exc:
            timing.record_error(exc)
        else:
            timing.latencies_ns.append(clock() - begun)
    return timing


async def _async_caller(
    call: Callable[[str], Any], keys: list[str], deadline: float | None, prefix: str
) -> Timing:
    """One task's calls, timed, on the bench's loop."""
    timing = Timing()
    clock = time.perf_counter_ns
    for key in _keys(keys, deadline, prefix):
        begun = clock()
        try:
            await call(key)
        except Exception as exc:
            timing.record_error(exc)
        else:
            timing.latencies_ns.append(clock() - begun)
    return timing


async def _callers(
    side: Side,
    pool: ThreadPoolExecutor | None,
    keys: list[list[str]],
    deadline: float | None,
    prefixes: list[str],
) -> Timing:
    """One caller per list of ``keys`` at once, timed together; their executions added up."""
    before = side.executions.count
    started = time.perf_counter()
    if pool is not None:
        loop = asyncio.get_running_loop()
        runs: list[Awaitable[Timing]] = [
            loop.run_in_executor(pool, _sync_caller, side.call, mine, deadline, prefix)
            for mine, prefix in zip(keys, prefixes, strict=True)
        ]
    else:
        runs = [
            _async_caller(side.call, mine, deadline, prefix)
            for mine, prefix in zip(keys, prefixes, strict=True)
        ]
    timing = merge(await asyncio.gather(*runs))
    timing.seconds = time.perf_counter() - started
    timing.executions = side.executions.count - before
    return timing


async def _first_then_replay(
    side: Side, pool: ThreadPoolExecutor | None, prefix: str, part: Load
) -> tuple[Timing, Timing]:
    """First calls on fresh keys (half of a round's operations, or of its seconds), then
    their replays (the other half), each by ``part.concurrency`` callers."""
    n = part.concurrency
    prefixes = [f"{prefix}w{w}-" for w in range(n)]
    if part.ops is not None:
        per_caller = replace(part, ops=max(n, part.ops // 2)).per_worker()
        keys = [
            [f"{p}{j}" for j in range(count or 0)]
            for p, count in zip(prefixes, per_caller, strict=True)
        ]
        first = await _callers(side, pool, keys, None, prefixes)
    else:
        keys = [[] for _ in range(n)]
        deadline = time.monotonic() + (part.duration or 0.0) / 2
        first = await _callers(side, pool, keys, deadline, prefixes)
    every = [key for mine in keys for key in mine]
    first.unique_keys = len(every)
    # Each caller replays keys another one called first, when there are several callers.
    spread = [every[w::n] for w in range(n)]
    replay = await _callers(side, pool, spread, None, prefixes)
    return first, replay


async def timed_rounds(sides: list[Side], load: Load, prefix: str) -> list[Timed]:
    """Every side's first calls and replays at ``load.concurrency``, in short rounds (at most
    ``ROUND_SECONDS`` per side in a timed run: the speed of a shared machine drifts within
    seconds), who goes first rotating so that no side always runs on another's heels."""
    n = load.concurrency
    timed = [Timed() for _ in sides]
    pools = [
        ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"peers-{side.label}")
        if side.door == "sync"
        else None
        for side in sides
    ]
    try:
        # Untimed first calls by every caller: pools open their connections, threads start,
        # scripts get loaded.
        for side, pool in zip(sides, pools, strict=True):
            warm = [[f"{prefix}{side.label}-warm-{w}"] for w in range(n)]
            await _callers(side, pool, warm, None, [""] * n)
        for r, part in enumerate(rounds_of(load)):
            for i in [(r + i) % len(sides) for i in range(len(sides))]:
                first, replay = await _first_then_replay(
                    sides[i], pools[i], f"{prefix}{sides[i].label}-{r}-", part
                )
                timed[i].first.append(first)
                timed[i].replay.append(replay)
    finally:
        for pool in pools:
            if pool is not None:
                # Every call has returned unless the run was cancelled: then the threads end
                # after their current call.
                pool.shutdown(wait=False, cancel_futures=True)
    return timed
