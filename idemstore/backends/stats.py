"""What a store holds right now, as ``idemstore stats URL`` prints it.

Backends that can count implement the optional ``SupportsStats`` protocol. Counting is an
operator's tool, not a hot path: each backend says in ``StoreStats.method`` how it counted and
what that cost, and backends without an engine-side count stop at ``limit`` records examined
(then ``complete`` is false and the counts are lower bounds).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_LIMIT",
    "StatsTally",
    "StoreStats",
    "SupportsStats",
    "counted_in_one_query",
    "format_stats",
]

# Records a scanning backend (Redis, DynamoDB) examines at most by default.
DEFAULT_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts of the records a store holds, at one moment of its engine's clock.

    ``in_progress``: live records whose lease is running. ``lapsed``: live records still in
    progress whose lease ran out (the next ``reserve`` takes them over). ``completed``: live
    completed records (replayed to retries). ``expired``: records past retention that are
    still stored (``sweep`` or the engine's own expiry removes them; no read returns them).
    ``oldest_in_progress_age``: seconds since the oldest live in-progress record (running or
    lapsed) was reserved, ``None`` when there is none. ``scanned``: records examined.
    ``complete``: false when counting stopped at the limit. ``method``: how it was counted.
    """

    in_progress: int
    lapsed: int
    completed: int
    expired: int
    oldest_in_progress_age: float | None
    scanned: int | None
    complete: bool
    method: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class SupportsStats(Protocol):
    """A store that can count its records (``idemstore stats``)."""

    async def stats(self, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
        """Count records by state; examine at most ``limit`` where the engine cannot count."""
        ...


class StatsTally:
    """Counts records one by one, for backends that read them rather than count them.

    Every backend classifies a record by the same rules (those of its reads): past retention
    first, whatever its state; then released tombstones are not live; then the lease.
    """

    __slots__ = ("completed", "expired", "in_progress", "lapsed", "now", "oldest", "scanned")

    def __init__(self, now: float) -> None:
        self.now = now
        self.in_progress = self.lapsed = self.completed = self.expired = self.scanned = 0
        self.oldest = math.inf

    def add(
        self,
        status: str,
        created_at: float,
        expires_at: float,
        lease_expires_at: float | None,
    ) -> None:
        """One stored record; ``status`` is ``in_progress``, ``completed`` or ``released``."""
        self.scanned += 1
        if expires_at <= self.now:
            self.expired += 1
        elif status == "completed":
            self.completed += 1
        elif status == "in_progress":
            if lease_expires_at is not None and lease_expires_at > self.now:
                self.in_progress += 1
            else:
                self.lapsed += 1
            self.oldest = min(self.oldest, created_at)

    def result(self, *, complete: bool, method: str) -> StoreStats:
        oldest = None if self.oldest == math.inf else max(0.0, self.now - self.oldest)
        return StoreStats(
            in_progress=self.in_progress,
            lapsed=self.lapsed,
            completed=self.completed,
            expired=self.expired,
            oldest_in_progress_age=oldest,
            scanned=self.scanned,
            complete=complete,
            method=method,
        )


def counted_in_one_query(
    row: Sequence[Any], *, method: str, oldest_age: Callable[[Any], float | None] | None = None
) -> StoreStats:
    """The stats of one SQL row ``(in_progress, lapsed, completed, expired, oldest, total)``,
    the engine having counted every record (no limit applies); ``oldest_age`` turns the
    engine's ``oldest`` column into an age in seconds (``None``: the column is the age)."""
    in_progress, lapsed, completed, expired, oldest, total = row
    return StoreStats(
        in_progress=in_progress,
        lapsed=lapsed,
        completed=completed,
        expired=expired,
        oldest_in_progress_age=oldest if oldest_age is None else oldest_age(oldest),
        scanned=total,
        complete=True,
        method=method,
    )


def format_stats(backend: str, stats: StoreStats) -> str:
    """What ``idemstore stats`` prints: one fact per line."""
    bound = "" if stats.complete else " (at least: counting stopped at the limit)"
    if stats.oldest_in_progress_age is None:
        oldest = "none in progress"
    else:
        oldest = f"reserved {stats.oldest_in_progress_age:.1f} s ago"
    rows = [
        ("backend", backend),
        ("in progress", f"{stats.in_progress:,}{bound}"),
        ("lapsed leases", f"{stats.lapsed:,}{bound}"),
        ("completed", f"{stats.completed:,}{bound}"),
        ("past retention, not yet removed", f"{stats.expired:,}{bound}"),
        ("oldest in-progress record", oldest),
        ("counted by", stats.method),
    ]
    if stats.scanned is not None:
        rows.append(("records examined", f"{stats.scanned:,}"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
