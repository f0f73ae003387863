"""An opt-in, bounded in-process cache of completed records in front of any store.

A completed record never changes until its retention ends or someone deletes it, so a replay
of a key this process has already seen completed can be answered from memory instead of a
round trip to the engine. ``CachedStore`` wraps any ``IdempotencyStore``:

- it holds completed records only (never one in progress: that one still changes), keyed by
  ``(scope, key)``, least recently used first out, bounded by entries and optionally by bytes;
- ``reserve`` on a cached key answers as the store would, without a round trip: ``COMPLETED``
  with the record for the same fingerprint, ``MISMATCH`` with it for another; ``get`` and
  ``wait`` are served from it too;
- an entry lives at most ``max_age`` seconds, and never past the record's retention end: the
  engine's ``expires_at`` is converted to the local monotonic clock when the record is read,
  less ``clock_margin`` seconds for the skew between the engine's clock and this host's;
- ``delete``, ``release`` and ``complete`` through the wrapper drop the key. A ``delete`` in
  another process cannot reach this cache: the deleted key may still replay here for up to
  ``max_age`` seconds. That is the trade-off the caller opts into, and ``max_age`` bounds it.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from idemstore.backends.arguments import reserve_arguments
from idemstore.backends.envelope import lost_reserve
from idemstore.errors import ConfigurationError
from idemstore.protocol import ForwardingStore, Outcome, Reservation, Status, answers_inline
from idemstore.records import check_timeout

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore, Lease, Record

__all__ = ["DEFAULT_CLOCK_MARGIN", "DEFAULT_MAX_AGE", "CacheInfo", "CachedStore"]

DEFAULT_MAX_AGE = 60.0
# Engines and hosts kept by NTP agree within milliseconds; a second covers a badly kept host
# and the time between the engine reading its clock and this process reading its own.
DEFAULT_CLOCK_MARGIN = 1.0

_COMPLETED = Status.COMPLETED


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """What a ``CachedStore`` holds and how often it answered (``hits``) or asked (``misses``)."""

    hits: int
    misses: int
    entries: int
    bytes: int


class _Entry:
    __slots__ = ("deadline", "record", "replay", "size")

    def __init__(self, record: Record, deadline: float, size: int) -> None:
        self.record = record
        self.deadline = deadline  # the monotonic reading after which the entry is never served
        self.size = size
        # Immutable, so one Reservation answers every replay of the same fingerprint.
        self.replay = Reservation(Outcome.COMPLETED, None, record, False)


class CachedStore(ForwardingStore):
    """``store`` with a bounded in-process cache of its completed records in front of it.

    Args:
        store: any ``IdempotencyStore``; the wrapper enters and closes it.
        max_entries: most records held; the least recently used goes first.
        max_bytes: most response bytes held (``None``: no byte bound). A response larger
            than this is never cached.
        max_age: longest time, in seconds, an entry is served: also the longest a key deleted
            by another process may still replay here.
        clock_margin: seconds taken off every record's remaining retention, for the skew
            between the engine's clock (which set ``expires_at``) and this host's.
        clock: this host's wall clock (epoch seconds), the stand-in for the engine's;
            ``monotonic``: the clock entries age by. Both are injectable for tests
            (``idemstore.testing.FakeClock``).

    Attributes it does not define (``stats``, engine specifics) are read from ``store``.
    """

    __slots__ = (
        "_bytes",
        "_clock",
        "_closed",
        "_entries",
        "_epoch",
        "_hits",
        "_misses",
        "_monotonic",
        "clock_margin",
        "max_age",
        "max_bytes",
        "max_entries",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        max_entries: int = 1000,
        max_bytes: int | None = None,
        max_age: float = DEFAULT_MAX_AGE,
        clock_margin: float = DEFAULT_CLOCK_MARGIN,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store)
        self.max_entries = _count("max_entries", max_entries)
        self.max_bytes = None if max_bytes is None else _count("max_bytes", max_bytes)
        self.max_age = _seconds("max_age", max_age, allow_zero=False)
        self.clock_margin = _seconds("clock_margin", clock_margin, allow_zero=True)
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        # Bumped by every delete and release: a read that was in flight across one must not
        # put back what was just removed.
        self._epoch = 0
        self._hits = 0
        self._misses = 0
        self._closed = False
        self._clock = clock
        self._monotonic = monotonic

    def __repr__(self) -> str:
        return f"CachedStore({self.wrapped!r}, max_entries={self.max_entries})"

    @property
    def answers_inline(self) -> bool:
        """The wrapped store's declaration: a cache hit never suspends, a miss is the store's."""
        return answers_inline(self.wrapped)

    def cache_info(self) -> CacheInfo:
        """Hits, misses, and what the cache holds now."""
        return CacheInfo(self._hits, self._misses, len(self._entries), self._bytes)

    def forget(self, key: str, *, scope: str = "") -> None:
        """Drop ``(scope, key)`` from this process's cache (the store keeps its record); a
        read already in flight for it does not put it back."""
        self._invalidate((scope, key))

    # -- the cache ---------------------------------------------------------------------------

    def _cached(self, scope: object, key: object) -> _Entry | None:
        # Only exact str take the cache: anything else goes to the store, which refuses it
        # with the error every store gives (and an unhashable key cannot break the lookup).
        if type(key) is not str or type(scope) is not str or self._closed:
            return None
        identity = (scope, key)
        entry = self._entries.get(identity)
        if entry is None:
            self._misses += 1
            return None
        if self._monotonic() >= entry.deadline:
            self._drop(identity)
            self._misses += 1
            return None
        self._entries.move_to_end(identity)
        self._hits += 1
        return entry

    def _remember(self, record: Record | None, epoch: int) -> None:
        if record is None or record.status is not _COMPLETED or epoch != self._epoch:
            return
        if self._closed:
            return
        response = record.response or b""
        size = len(response)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        # expires_at is on the engine's clock; this host's wall clock stands in for it, less
        # the margin, and the rest of the entry's life is counted on the monotonic clock so
        # that a wall-clock step after this point cannot stretch it.
        left = min(self.max_age, record.expires_at - self._clock() - self.clock_margin)
        if left <= 0:
            return
        identity = (record.scope, record.key)
        self._drop(identity)
        self._entries[identity] = _Entry(record, self._monotonic() + left, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or (
            self.max_bytes is not None and self._bytes > self.max_bytes
        ):
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    def _drop(self, identity: tuple[str, str]) -> None:
        entry = self._entries.pop(identity, None)
        if entry is not None:
            self._bytes -= entry.size

    def _invalidate(self, identity: tuple[str, str]) -> None:
        self._epoch += 1
        self._drop(identity)

    # -- the contract -------------------------------------------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        entry = self._cached(scope, key)
        if entry is not None:
            # The key and scope matched one the store accepted, so only the fingerprint and
            # the durations are left to check, as the store would before answering.
            reserve_arguments(
                key, fingerprint, scope, lease_ttl, retention, max_key_length=len(key)
            )
            if fingerprint == entry.record.fingerprint:
                return entry.replay
            return lost_reserve(entry.record, fingerprint)
        epoch = self._epoch
        reservation = await self.wrapped.reserve(
            key, fingerprint, scope=scope, lease_ttl=lease_ttl, retention=retention
        )
        self._remember(reservation.record, epoch)
        return reservation

    async def _complete(self, lease: Lease, response: bytes, retention: float | None) -> bool:
        done = await self.wrapped.complete(lease, response, retention=retention)
        if done:
            # Only a record deleted elsewhere could still be cached for a key just completed.
            self._drop((lease.scope, lease.key))
        return done

    async def _release(self, lease: Lease) -> bool:
        identity = (lease.scope, lease.key)
        self._invalidate(identity)
        try:
            return await self.wrapped.release(lease)
        finally:
            self._invalidate(identity)

    async def _get(self, key: str, scope: str) -> Record | None:
        entry = self._cached(scope, key)
        if entry is not None:
            return entry.record
        epoch = self._epoch
        record = await self.wrapped.get(key, scope=scope)
        self._remember(record, epoch)
        return record

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        entry = self._cached(scope, key)
        if entry is not None:
            check_timeout(timeout)
            return entry.record  # completed: no lease holds the key
        epoch = self._epoch
        record = await self.wrapped.wait(key, scope=scope, timeout=timeout)
        self._remember(record, epoch)
        return record

    async def _delete(self, key: str, scope: str) -> bool:
        # Dropped before and after: a read that started before the store deleted the record
        # finds the epoch moved and does not put it back.
        identity = (scope, key)
        self._invalidate(identity)
        try:
            return await self.wrapped.delete(key, scope=scope)
        finally:
            self._invalidate(identity)

    # extend, sweep and ping are forwarded as they are: entries never outlive their record's
    # retention, so sweeping has nothing to drop here.

    async def close(self) -> None:
        self._closed = True
        self._entries.clear()
        self._bytes = 0
        await self.wrapped.close()

    async def _enter(self) -> None:
        try:
            await self.wrapped.__aenter__()
        except BaseException:
            await self.close()
            raise

    async def _leave(self, exc: BaseException | None) -> None:
        await self.close()


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a whole number of at least 1, not {value!r}")
    return value


def _seconds(name: str, value: object, *, allow_zero: bool) -> float:
    least = "0 or more" if allow_zero else "more than 0"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be {least} seconds, not {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(f"{name} must be {least} seconds (finite), not {value!r}")
    return seconds
