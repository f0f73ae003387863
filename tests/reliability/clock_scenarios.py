"""Clock scenarios: a history run (``history.Worker``s sharing rounds of keys, checked by
``check_history`` in real time) while the clock the store's leases are measured by moves.

- a **step** of a single engine's clock mid-run (``ShiftedClock.set``: an NTP step, an
  operator's ``date -s``), on Redis (the clock shim), PostgreSQL (libfaketime) and SQLite (the
  host's clock: SQLite has no engine process, the stores read the host clock through their
  ``clock`` option, which every worker shares as every process on one host would);
- **DynamoDB clients whose clocks disagree**: half the workers read a clock that steps
  ``offset`` seconds ahead mid-run (DynamoDB measures leases with each client's clock, less
  its ``clock_skew`` margin of 0.1 s);
- a **failover to a standby whose clock is off** by ``offset`` seconds: the PostgreSQL
  primary crashes mid-run and its standby, started under libfaketime, is promoted (the store
  URL lists both).

The checker orders calls by the workers' monotonic stamps, which no engine clock moves: an
execution that began while the previous owner's lease was still live in real time is counted
in ``duplicates found`` (executions that overlapped), and ``lost acknowledgements`` counts
acknowledged completions a later reserve or the final read did not find. A run whose
history breaks a rule keeps its logs (``kept history`` in the row).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.reliability.history import (
    HistoryLog,
    HistoryReport,
    Worker,
    WorkerConfig,
    check_history,
    read_events,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore import IdempotencyStore

__all__ = ["CLOCK_CONFIG", "clock_history", "keep_if_broken"]

# Leases of 1.5 s that every execution fits in (work at most 1 s), two in five heartbeating
# (every 0.5 s): without a clock that moves, no lease lapses under a live owner. A step or a
# skew shortens every live lease by its size in one go.
CLOCK_CONFIG = replace(
    WorkerConfig(),
    lease_ttl=1.5,
    work_max=0.3,
    long_work_probability=0.2,
    long_work_max=1.0,
    heartbeat_probability=0.4,
    release_probability=0.05,
)


async def clock_history(
    store: IdempotencyStore | list[IdempotencyStore],
    directory: Path,
    *,
    fault: Callable[[], Awaitable[dict[str, Any]]],
    before: float,
    after: float,
    seed: int,
    workers: int = 4,
    keys_per_round: int = 20,
    config: WorkerConfig = CLOCK_CONFIG,
) -> HistoryReport:
    """Workers settle rounds of keys for ``before`` seconds, then ``fault`` moves the clock
    (it returns what it did, for the row), and they go on for ``after`` seconds; a finisher
    settles every key and the history is checked. Given several stores (clients whose
    clocks differ), worker ``i`` uses store ``i`` modulo their number."""
    stores = store if isinstance(store, list) else [store]
    rng = random.Random(seed)
    prefix = f"c{seed:x}:"
    stop_at = [float("inf")]
    logs = [HistoryLog(directory / f"w{index}.jsonl", f"w{index}") for index in range(workers)]
    tasks = [
        asyncio.create_task(
            Worker(
                stores[index % len(stores)], log, random.Random(rng.randrange(2**32)), config
            ).run_rounds(prefix, keys_per_round, lambda: time.monotonic() >= stop_at[0])
        )
        for index, log in enumerate(logs)
    ]
    started = time.monotonic()
    await asyncio.sleep(before)
    fault_at = time.monotonic()
    done = await fault()
    stop_at[0] = time.monotonic() + after
    await asyncio.gather(*tasks)
    for log in logs:
        log.close()
    paths = [directory / f"w{index}.jsonl" for index in range(workers)]
    keys = sorted({event["key"] for event in read_events(paths)})
    finisher = HistoryLog(directory / "finisher.jsonl", "finisher")
    await Worker(stores[0], finisher, random.Random(rng.randrange(2**32)), config).settle_all(keys)
    finisher.close()
    final = {key: await stores[0].get(key) for key in keys}
    report = check_history(read_events([*paths, directory / "finisher.jsonl"]), final)
    report.run.update(
        {
            "seconds": round(time.monotonic() - started, 1),
            "fault seconds": round(time.monotonic() - fault_at, 1),
            "workers": workers,
            "lease seconds": config.lease_ttl,
            "seed": seed,
            **done,
        }
    )
    return report


def keep_if_broken(report: HistoryReport, directory: Path) -> dict[str, Any]:
    """The row for ``report_counts``; the logs are kept (moved out of the test's temporary
    directory) when the history shows a violation, and removed otherwise."""
    row = {**report.row(), "violations": report.violations[:5]}
    if report.violations:
        kept = Path(tempfile.mkdtemp(prefix="idemstore-clock-history-"))
        for path in directory.glob("*.jsonl"):
            shutil.copy(path, kept / path.name)
        row["kept history"] = str(kept)
    return row
