"""The measured inputs of ``idemstore plan``, in one place, with the run that produced them.

Every figure below was read off one run of the ``cost`` bench scenario (``SOURCE``): copy a
new run's ``results.json`` notes here to plan for another machine or version. Bytes per
record are kept at each response size measured, as the engine reported them; the plan joins
the points with straight lines. CPU seconds are the server's own (Redis ``INFO cpu``,
PostgreSQL's processes in ``/proc``), or the process's for an embedded engine.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["MEASURED", "SOURCE", "Curve", "EngineCosts", "Source"]


@dataclass(frozen=True, slots=True)
class Source:
    command: str
    date: str
    machine: str


SOURCE = Source(
    command="idemstore bench --local --scenario cost --ops 1000",
    date="2026-12-06",
    machine="the project's shared 2-core VM; Redis 7.0.15, PostgreSQL 15.18, moto",
)


@dataclass(frozen=True, slots=True)
class Curve:
    """A quantity as a function of the response size: measured ``(bytes, value)`` points,
    joined by straight lines, and continued past either end along the nearest segment."""

    points: tuple[tuple[int, float], ...]

    def at(self, response_bytes: float) -> float:
        points = self.points
        if len(points) == 1:
            return points[0][1]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if response_bytes <= x1 or (x1, y1) == points[-1]:
                return y0 + (y1 - y0) * (response_bytes - x0) / (x1 - x0)
        raise AssertionError("unreachable: the last segment takes every size past it")


@dataclass(frozen=True, slots=True)
class EngineCosts:
    """What one engine was measured to take: per record (``record_bytes``, described by
    ``holds``), per new key (``*_new``: reserve + complete) and per replay (``*_replay``)."""

    holds: str
    record_bytes: Curve
    round_trips_new: float | None = None
    round_trips_replay: float | None = None
    transactions_new: float | None = None
    transactions_replay: float | None = None
    cpu_new: float | None = None
    cpu_replay: float | None = None
    wal_new: Curve | None = None
    wal_replay: float | None = None
    # Expired rows one sweeper removes a second (the cost scenario's sweep phase).
    sweep_rows_per_second: float | None = None
    # One writer's seconds per new key (p50 of the cost scenario, one worker).
    new_call_seconds: float | None = None
    # DynamoDB: the item a reserve creates, before complete adds the response.
    in_progress_item_bytes: float | None = None


# CPU seconds per call: the mean over the three response sizes (they differ by less than
# the run's noise); PostgreSQL's from /proc in 10 ms ticks, over 400 calls a size. The sweep
# rates come from 400 rows swept at once: PostgreSQL's was 24k rows/s in the run before this
# one, so read it as a rate within a factor of three.
MEASURED: dict[str, EngineCosts] = {
    "memory": EngineCosts(
        holds="process memory (allocations traced)",
        record_bytes=Curve(((256, 700.8), (1024, 1577.8), (4096, 4533.8))),
        cpu_new=18.1e-6,
        cpu_replay=8.5e-6,
        sweep_rows_per_second=293_054,
    ),
    "sqlite": EngineCosts(
        holds="file (page_count x page_size)",
        record_bytes=Curve(((256, 522.2), (1024, 1443.8), (4096, 4659.2))),
        cpu_new=383.6e-6,
        cpu_replay=45.8e-6,
        sweep_rows_per_second=194_470,
        new_call_seconds=0.000591,  # synchronous=FULL, on the VM's disk
    ),
    "postgres": EngineCosts(
        holds="table + index + TOAST (pg_total_relation_size)",
        record_bytes=Curve(((256, 1003.5), (1024, 1720.3), (4096, 6287.4))),
        transactions_new=2.02,
        transactions_replay=2.03,
        cpu_new=216.7e-6,
        cpu_replay=75e-6,
        wal_new=Curve(((256, 961.1), (1024, 1740.5), (4096, 5271.2))),
        wal_replay=10.7,
        sweep_rows_per_second=60_907,
    ),
    "redis": EngineCosts(
        holds="memory (MEMORY USAGE of the record keys)",
        record_bytes=Curve(((256, 1104.0), (1024, 2064.0), (4096, 5904.0))),
        round_trips_new=2.0,
        round_trips_replay=1.0,
        cpu_new=60.7e-6,
        cpu_replay=28.4e-6,
    ),
    "dynamodb": EngineCosts(
        holds="item (AWS's size rules; responses from 1 KB stored zlib-compressed)",
        record_bytes=Curve(((256, 598.2), (1024, 1217.9), (4096, 3770.0))),
        round_trips_new=2.0,  # the store's design: one request per operation (not measured)
        round_trips_replay=1.0,
        in_progress_item_bytes=323.0,
    ),
}
