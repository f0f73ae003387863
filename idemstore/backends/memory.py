"""``memory://``: records in a dict of this process. For tests, single-process servers and the
MCP proxy's default; nothing survives the process."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from idemstore.backends.arguments import retention_while_held
from idemstore.backends.envelope import InlineStoreEnvelope, lost_reserve
from idemstore.backends.stats import StatsTally, StoreStats
from idemstore.backends.store_options import Option, Options, at_least, check_clock
from idemstore.backends.urls import parse_store_url
from idemstore.backends.waiting import Sighting, wait_for_holder
from idemstore.errors import ConfigurationError, StoreUnavailableError
from idemstore.protocol import Checkpoint, Lease, Outcome, Record, Reservation, Status
from idemstore.records import MAX_KEY_LENGTH, new_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from idemstore.records import RecordQuery

__all__ = ["OPTIONS", "MemoryStore"]

OPTIONS = Options(
    Option(
        "max_key_length",
        int,
        MAX_KEY_LENGTH,
        "longest key accepted, in characters",
        check=at_least(1),
    ),
    Option("clock", object, time.time, "the time source, epoch seconds", check_clock, url=False),
)

# Enum members as module constants: on Python 3.11 ``Status.IN_PROGRESS`` is a descriptor
# call (about 0.1 µs), and a fresh reserve and complete name four of them.
_IN_PROGRESS = Status.IN_PROGRESS
_COMPLETED = Status.COMPLETED
_ACQUIRED = Outcome.ACQUIRED


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    token: str
    fence: int
    created_at: float
    expires_at: float
    lease_expires_at: float | None
    retention: float
    status: Status = Status.IN_PROGRESS
    response: bytes | None = None
    # A released entry is a tombstone: invisible to reads, but it keeps the fence so the next
    # acquisition gets a higher one than any lease handed out before.
    released: bool = False
    # The lease this entry's acquisition handed out: a caller presenting this very object
    # (Lease is frozen) holds a lease this store issued, so its fields need no validation.
    lease: Lease | None = None
    # Recovery points, oldest first: kept by a takeover, dropped by a fresh acquisition.
    checkpoints: tuple[Checkpoint, ...] = ()


class _Waiter:
    """A ``wait``'s subscription: an event in the store's per-key set, always pushing."""

    __slots__ = ("_waiters", "event")

    def __init__(self, waiters: set[asyncio.Event]) -> None:
        self._waiters = waiters
        self.event = asyncio.Event()
        waiters.add(self.event)

    pushing = True

    def close(self) -> None:
        self._waiters.discard(self.event)


class MemoryStore(InlineStoreEnvelope):
    """An in-process store. Every operation runs without awaiting, so it is atomic among the
    tasks of one event loop. ``clock`` (epoch seconds) can be injected for tests."""

    __slots__ = ("_clock", "_entries", "_waiters")

    answers_inline = True
    """No operation but ``wait`` suspends (see ``idemstore.protocol.answers_inline``)."""

    process_local = True
    """Its records live in this process: doors warn when a server forks several workers."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_key_length: int = MAX_KEY_LENGTH,
    ) -> None:
        given = OPTIONS.check(locals())
        super().__init__(max_key_length=given["max_key_length"])
        self._handed = None  # _issued knows this store's leases by its entries
        self._clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}
        # Events of the waits on each key; the sets outlive entries (a reserve replaces one).
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        parsed = parse_store_url(url, options)
        if parsed.netloc or parsed.path not in ("", "/"):
            raise ConfigurationError("a memory store URL takes no host or path: use memory://")
        return cls(**OPTIONS.from_url(parsed))

    # -- helpers ------------------------------------------------------------------------

    def _live(self, scope: str, key: str, now: float) -> _Entry | None:
        entry = self._entries.get((scope, key))
        if entry is None or entry.released or entry.expires_at <= now:
            return None
        return entry

    @staticmethod
    def _record(scope: str, key: str, entry: _Entry) -> Record:
        return Record(
            scope=scope,
            key=key,
            fingerprint=entry.fingerprint,
            status=entry.status,
            token=entry.token,
            fence=entry.fence,
            response=entry.response,
            created_at=entry.created_at,
            expires_at=entry.expires_at,
            lease_expires_at=entry.lease_expires_at if entry.status is _IN_PROGRESS else None,
            checkpoints=entry.checkpoints,
        )

    def _issued(self, lease: Lease) -> bool:
        """Whether the entry of ``lease``'s key was acquired with this very object (Lease is
        frozen, so it is the lease this store handed out, unchanged)."""
        if type(lease) is not Lease:
            return False
        try:
            entry = self._entries.get((lease.scope, lease.key))
        except TypeError:  # a forged lease with an unhashable scope or key
            return False
        return entry is not None and entry.lease is lease

    def _holder(self, lease: Lease) -> _Entry | None:
        """The entry iff ``lease`` (a lease that could be real) still owns it: same token
        and fence, in progress, live."""
        entry = self._entries.get((lease.scope, lease.key))
        if (
            entry is None
            or entry.released
            or entry.status is not _IN_PROGRESS
            or entry.token != lease.token
            or entry.fence != lease.fence
            or entry.expires_at <= self._clock()
        ):
            return None
        return entry

    def _wake(self, scope: str, key: str) -> None:
        for event in self._waiters.get((scope, key), ()):
            event.set()

    # -- the contract: hooks of the envelope, answered in place -----------------------------

    def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        now = self._clock()
        identity = (scope, key)
        previous = self._entries.get(identity)
        live = (
            None
            if previous is None or previous.released or previous.expires_at <= now
            else previous
        )
        takeover = False
        if live is not None:
            lease_end = live.lease_expires_at
            if (
                live.fingerprint != fingerprint
                or live.status is _COMPLETED
                or (lease_end is not None and lease_end > now)
            ):
                return lost_reserve(self._record(scope, key, live), fingerprint)
            takeover = True
        fence = previous.fence + 1 if previous is not None else 1
        token = new_token()
        deadline = now + lease_ttl
        lease = Lease(scope, key, token, fence, deadline, retention)
        # Positional, in field order: this is the hot path of every first execution.
        self._entries[identity] = _Entry(
            fingerprint,
            token,
            fence,
            now,
            now + retention_while_held(lease_ttl, retention),
            deadline,
            retention,
            _IN_PROGRESS,
            None,
            False,
            lease,
        )
        if takeover:
            assert live is not None
            kept = self._entries[identity].checkpoints = live.checkpoints
            return Reservation(_ACQUIRED, lease, None, True, kept)
        return Reservation(_ACQUIRED, lease, None, False)

    def _complete(self, lease: Lease, response: bytes, retention: float) -> bool:
        entry = self._holder(lease)
        if entry is None:
            return False
        entry.status = _COMPLETED
        entry.response = response
        entry.lease_expires_at = None
        entry.expires_at = self._clock() + retention
        if self._waiters:  # most completions have nobody waiting: skip the lookup
            self._wake(lease.scope, lease.key)
        return True

    def _release(self, lease: Lease) -> bool:
        entry = self._holder(lease)
        if entry is None:
            return False
        entry.released = True
        entry.lease_expires_at = None
        self._wake(lease.scope, lease.key)
        return True

    def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        entry = self._holder(lease)
        if entry is None:
            return None
        assert entry.lease_expires_at is not None
        now = self._clock()
        if entry.lease_expires_at <= now:
            # The lease lapsed; nobody took it over, but extending it now would let a holder
            # keep a key others were entitled to take. Report it lost.
            return None
        deadline = now + lease_ttl
        entry.lease_expires_at = deadline
        entry.expires_at = now + retention_while_held(lease_ttl, entry.retention)
        return Lease(lease.scope, lease.key, lease.token, lease.fence, deadline, lease.retention)

    def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        entry = self._holder(lease)
        if entry is None:
            return False
        entry.checkpoints = (*entry.checkpoints, Checkpoint(name, data))
        return True

    def _get(self, key: str, scope: str) -> Record | None:
        live = self._live(scope, key, self._clock())
        return None if live is None else self._record(scope, key, live)

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        async def read() -> Sighting:
            self._check_open()
            now = self._clock()
            live = self._live(scope, key, now)
            return Sighting(None if live is None else self._record(scope, key, live), now)

        async def subscribe() -> _Waiter:
            return _Waiter(self._waiters.setdefault((scope, key), set()))

        try:
            return await wait_for_holder(
                read, timeout=timeout, unavailable=_never, subscribe=subscribe
            )
        finally:
            if not self._waiters.get((scope, key), True):
                del self._waiters[(scope, key)]

    def _delete(self, key: str, scope: str) -> bool:
        existed = self._live(scope, key, self._clock()) is not None
        if self._entries.pop((scope, key), None) is not None:
            self._wake(scope, key)
        return existed

    def _sweep(self, limit: int) -> int:
        now = self._clock()
        expired = [k for k, e in self._entries.items() if e.expires_at <= now][:limit]
        for k in expired:
            del self._entries[k]
            self._wake(*k)
        return len(expired)

    async def _stats(self, limit: int) -> StoreStats:
        """Counted in process, one pass over every record (``limit`` does not apply: the
        records are in this process's memory already)."""
        tally = StatsTally(self._clock())
        for entry in self._entries.values():
            status = "released" if entry.released else entry.status.value
            tally.add(status, entry.created_at, entry.expires_at, entry.lease_expires_at)
        return tally.result(complete=True, method="one pass over the records in this process")

    async def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        """One pass over a copy of this process's records (the dict may change meanwhile)."""
        now = self._clock()
        for (scope, key), entry in list(self._entries.items()):
            if entry.released or entry.expires_at <= now:
                continue
            record = self._record(scope, key, entry)
            if query.matches(record, now):
                yield record

    async def _ping(self) -> None:
        pass

    async def _shut(self) -> None:
        for scope, key in list(self._waiters):
            self._wake(scope, key)


def _never(exc: TimeoutError) -> StoreUnavailableError:
    # Reads of a dict cannot time out; the loop still needs the error it would raise.
    return StoreUnavailableError("the memory store did not answer in time")
