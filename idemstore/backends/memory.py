"""``memory://``: records in a dict of this process. For tests, single-process servers and the
MCP proxy's default; nothing survives the process."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from idemstore.errors import ConfigurationError
from idemstore.protocol import Lease, Outcome, Record, Reservation, Status
from idemstore.records import (
    MAX_KEY_LENGTH,
    check_duration,
    check_identity,
    check_limit,
    check_response,
    check_timeout,
    new_token,
)
from idemstore.stats import DEFAULT_LIMIT, StatsTally, StoreStats
from idemstore.urls import parse_store_url, pop_int

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["MemoryStore"]


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
    waiters: list[asyncio.Event] = field(default_factory=list)


class MemoryStore:
    """An in-process store. Every operation runs without awaiting, so it is atomic among the
    tasks of one event loop. ``clock`` (epoch seconds) can be injected for tests."""

    __slots__ = ("_clock", "_closed", "_entries", "_max_key_length")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_key_length: int = MAX_KEY_LENGTH,
    ) -> None:
        self._clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._max_key_length = max_key_length
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        parsed = parse_store_url(url, options)
        if parsed.netloc or parsed.path not in ("", "/"):
            raise ConfigurationError("a memory store URL takes no host or path: use memory://")
        max_key_length = pop_int(parsed.options, "max_key_length", MAX_KEY_LENGTH)
        parsed.reject_unknown()
        return cls(max_key_length=max_key_length)

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
            lease_expires_at=entry.lease_expires_at if entry.status is Status.IN_PROGRESS else None,
        )

    def _holder(self, lease: Lease) -> _Entry | None:
        """The entry iff ``lease`` still owns it: same token and fence, in progress, live."""
        entry = self._entries.get((lease.scope, lease.key))
        if (
            entry is None
            or entry.released
            or entry.status is not Status.IN_PROGRESS
            or entry.token != lease.token
            or entry.fence != lease.fence
            or entry.expires_at <= self._clock()
        ):
            return None
        return entry

    @staticmethod
    def _wake(entry: _Entry) -> None:
        for event in entry.waiters:
            event.set()
        entry.waiters.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MemoryStore is closed")

    # -- the contract ---------------------------------------------------------------------

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        check_identity(key, scope, fingerprint, max_key_length=self._max_key_length)
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        retention = check_duration("retention", retention)
        self._check_open()
        now = self._clock()
        previous = self._entries.get((scope, key))
        live = self._live(scope, key, now)
        takeover = False
        if live is not None:
            if live.fingerprint != fingerprint:
                return Reservation(Outcome.MISMATCH, record=self._record(scope, key, live))
            if live.status is Status.COMPLETED:
                return Reservation(Outcome.COMPLETED, record=self._record(scope, key, live))
            assert live.lease_expires_at is not None
            if live.lease_expires_at > now:
                return Reservation(Outcome.IN_PROGRESS, record=self._record(scope, key, live))
            takeover = True
        fence = previous.fence + 1 if previous is not None else 1
        entry = _Entry(
            fingerprint=fingerprint,
            token=new_token(),
            fence=fence,
            created_at=now,
            expires_at=now + retention,
            lease_expires_at=now + lease_ttl,
            retention=retention,
        )
        if previous is not None:
            # Whoever waited on the old lease must look again: it is a new owner now.
            entry.waiters = previous.waiters
        self._entries[(scope, key)] = entry
        lease = Lease(scope, key, entry.token, fence, now + lease_ttl, retention)
        return Reservation(Outcome.ACQUIRED, lease=lease, takeover=takeover)

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        response = check_response(response)
        keep = check_duration("retention", retention if retention is not None else lease.retention)
        self._check_open()
        entry = self._holder(lease)
        if entry is None:
            return False
        entry.status = Status.COMPLETED
        entry.response = response
        entry.lease_expires_at = None
        entry.expires_at = self._clock() + keep
        self._wake(entry)
        return True

    async def release(self, lease: Lease) -> bool:
        self._check_open()
        entry = self._holder(lease)
        if entry is None:
            return False
        entry.released = True
        entry.lease_expires_at = None
        self._wake(entry)
        return True

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        self._check_open()
        entry = self._holder(lease)
        if entry is None:
            return None
        assert entry.lease_expires_at is not None
        if entry.lease_expires_at <= self._clock():
            # The lease lapsed; nobody took it over, but extending it now would let a holder
            # keep a key others were entitled to take. Report it lost.
            return None
        deadline = self._clock() + lease_ttl
        entry.lease_expires_at = deadline
        return Lease(lease.scope, lease.key, lease.token, lease.fence, deadline, lease.retention)

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        check_identity(key, scope, max_key_length=self._max_key_length)
        self._check_open()
        live = self._live(scope, key, self._clock())
        return None if live is None else self._record(scope, key, live)

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        check_identity(key, scope, max_key_length=self._max_key_length)
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + check_timeout(timeout)
        while True:
            now = self._clock()
            live = self._live(scope, key, now)
            if live is None or live.status is Status.COMPLETED:
                return None if live is None else self._record(scope, key, live)
            assert live.lease_expires_at is not None
            if live.lease_expires_at <= now:
                return self._record(scope, key, live)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self._record(scope, key, live)
            event = asyncio.Event()
            live.waiters.append(event)
            try:
                # Also wake when the lease lapses: nobody will notify us of that.
                await asyncio.wait_for(event.wait(), min(remaining, live.lease_expires_at - now))
            except TimeoutError:
                pass
            finally:
                if event in live.waiters:
                    live.waiters.remove(event)

    async def delete(self, key: str, *, scope: str = "") -> bool:
        check_identity(key, scope, max_key_length=self._max_key_length)
        self._check_open()
        existed = self._live(scope, key, self._clock()) is not None
        entry = self._entries.pop((scope, key), None)
        if entry is not None:
            self._wake(entry)
        return existed

    async def sweep(self, *, limit: int = 1000) -> int:
        check_limit(limit)
        self._check_open()
        now = self._clock()
        expired = [k for k, e in self._entries.items() if e.expires_at <= now][:limit]
        for k in expired:
            self._wake(self._entries.pop(k))
        return len(expired)

    async def stats(self, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
        """Counted in process, one pass over every record (``limit`` does not apply: the
        records are in this process's memory already)."""
        self._check_open()
        tally = StatsTally(self._clock())
        for entry in self._entries.values():
            status = "released" if entry.released else entry.status.value
            tally.add(status, entry.created_at, entry.expires_at, entry.lease_expires_at)
        return tally.result(complete=True, method="one pass over the records in this process")

    async def ping(self) -> None:
        self._check_open()

    async def close(self) -> None:
        self._closed = True
        for entry in self._entries.values():
            self._wake(entry)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
