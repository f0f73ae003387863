"""A sixth backend that lives in the test tree: ``snapshot://``, registered in one call.

It proves that a backend is one module and one registration: this module holds the store,
its test fixture and the ``register_backend`` call, and nothing else in idemstore names it.
Loading it (``pytest -p tests.contract.sixth_backend``) puts it in the registry, and the
contract suite then runs on it like on any built-in engine.

The store is written for this and differs from ``memory://`` on purpose: every record is an
immutable snapshot replaced whole under one lock, fences are counted per key apart from the
records (so they never repeat, even after ``delete`` or ``sweep``), a record lives at least as
long as its lease (so a live lease is never swept or taken over), and waiters share one
``asyncio.Condition``. It composes only the engine-neutral rules of ``idemstore.records``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Self

import pytest

from idemstore import Checkpoint, Lease, Outcome, Record, Reservation, Status
from idemstore.backends.registry import Engine, FixtureVariant, register_backend
from idemstore.backends.urls import parse_store_url
from idemstore.checkpoints import check_checkpoint
from idemstore.errors import ConfigurationError
from idemstore.protocol import AsyncContext
from idemstore.records import (
    RecordQuery,
    RecordState,
    check_duration,
    check_identity,
    check_limit,
    check_response,
    check_timeout,
    lease_owns_nothing,
    new_token,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["ENGINE", "SnapshotStore", "snapshot_store_url"]

Identity = tuple[str, str]  # (scope, key)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    record: Record
    retention: float  # what complete() keeps the record for by default
    released: bool = False


class SnapshotStore(AsyncContext):
    """An in-process store of immutable record snapshots, one ``asyncio.Condition`` for all."""

    def __init__(self) -> None:
        self._rows: dict[Identity, _Snapshot] = {}
        self._fences: dict[Identity, int] = {}
        self._changed = asyncio.Condition()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        parsed = parse_store_url(url, options)
        if parsed.netloc or parsed.path not in ("", "/"):
            raise ConfigurationError("a snapshot store URL takes no host or path: snapshot://")
        parsed.reject_unknown()
        return cls()

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("this SnapshotStore is closed")

    def _live(self, identity: Identity, now: float) -> _Snapshot | None:
        row = self._rows.get(identity)
        if row is None or row.released or row.record.expires_at <= now:
            return None
        return row

    @staticmethod
    def _forged(lease: Lease) -> bool:
        # A lease no store could have issued (a forged token or fence, a corrupted retention)
        # owns nothing: the owner check fails, it is not an error, open or closed.
        return lease_owns_nothing(lease) or not _is_duration(lease.retention)

    def _held(self, lease: Lease, now: float) -> _Snapshot | None:
        """The row ``lease`` still owns, or None; a forged lease owns nothing even once the
        store is closed, any other call on a closed store raises."""
        if self._forged(lease):
            return None
        self._open()
        return self._owned(lease, now)

    def _owned(self, lease: Lease, now: float) -> _Snapshot | None:
        row = self._live((lease.scope, lease.key), now)
        if row is None or row.record.status is not Status.IN_PROGRESS:
            return None
        if (row.record.token, row.record.fence) != (lease.token, lease.fence):
            return None
        return row

    async def _store(self, identity: Identity, row: _Snapshot | None) -> None:
        if row is None:
            self._rows.pop(identity, None)
        else:
            self._rows[identity] = row
        async with self._changed:
            self._changed.notify_all()

    async def reserve(
        self, key: str, fingerprint: str, *, scope: str = "", lease_ttl: float, retention: float
    ) -> Reservation:
        check_identity(key, scope, fingerprint)
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        retention = check_duration("retention", retention)
        self._open()
        now = time.time()
        identity = (scope, key)
        row = self._live(identity, now)
        if row is not None:
            held = row.record
            if held.fingerprint != fingerprint:
                return Reservation(Outcome.MISMATCH, record=held)
            if held.status is Status.COMPLETED:
                return Reservation(Outcome.COMPLETED, record=held)
            if held.lease_expires_at is not None and held.lease_expires_at > now:
                return Reservation(Outcome.IN_PROGRESS, record=held)
        fence = self._fences.get(identity, 0) + 1
        self._fences[identity] = fence
        record = Record(
            scope=scope,
            key=key,
            fingerprint=fingerprint,
            status=Status.IN_PROGRESS,
            token=new_token(),
            fence=fence,
            response=None,
            created_at=now,
            # A live lease keeps its record alive, whatever the retention.
            expires_at=now + max(retention, lease_ttl),
            lease_expires_at=now + lease_ttl,
            # Only a takeover (a live row) resumes from the checkpoints recorded so far.
            checkpoints=row.record.checkpoints if row is not None else (),
        )
        await self._store(identity, _Snapshot(record, retention))
        lease = Lease(scope, key, record.token, fence, now + lease_ttl, retention)
        return Reservation(
            Outcome.ACQUIRED,
            lease=lease,
            takeover=row is not None,
            checkpoints=record.checkpoints,
        )

    async def checkpoint(self, lease: Lease, name: str, data: bytes = b"") -> bool:
        """The optional recovery-points capability (``CheckpointingStore``)."""
        data = check_checkpoint(name, data)
        if self._forged(lease):
            return False
        self._open()
        row = self._owned(lease, time.time())
        if row is None:
            return False
        record = replace(row.record, checkpoints=(*row.record.checkpoints, Checkpoint(name, data)))
        await self._store((lease.scope, lease.key), replace(row, record=record))
        return True

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        response = check_response(response)
        if retention is not None:
            retention = check_duration("retention", retention)
        now = time.time()
        row = self._held(lease, now)
        if row is None:
            return False
        keep = float(lease.retention) if retention is None else retention
        record = replace(
            row.record,
            status=Status.COMPLETED,
            response=response,
            expires_at=now + keep,
            lease_expires_at=None,
        )
        await self._store((lease.scope, lease.key), replace(row, record=record))
        return True

    async def release(self, lease: Lease) -> bool:
        row = self._held(lease, time.time())
        if row is None:
            return False
        await self._store((lease.scope, lease.key), replace(row, released=True))
        return True

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        now = time.time()
        row = self._held(lease, now)
        deadline = row.record.lease_expires_at if row is not None else None
        if row is None or deadline is None or deadline <= now:
            return None  # lost, or lapsed: extending it would steal what others may take
        record = replace(
            row.record,
            lease_expires_at=now + lease_ttl,
            expires_at=max(row.record.expires_at, now + lease_ttl),
        )
        await self._store((lease.scope, lease.key), replace(row, record=record))
        return replace(lease, lease_expires_at=now + lease_ttl)

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        check_identity(key, scope)
        self._open()
        row = self._live((scope, key), time.time())
        return None if row is None else row.record

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        check_identity(key, scope)
        timeout = check_timeout(timeout)
        self._open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            now = time.time()
            row = self._live((scope, key), now)
            if row is None:
                return None
            lease_end = row.record.lease_expires_at
            left = deadline - loop.time()
            if lease_end is None or lease_end <= now or left <= 0 or self._closed:
                return row.record
            # Any change wakes every waiter; a lapsing lease wakes nobody, so the wait is
            # also bounded by the lease's end.
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, lease_end - now))

    async def delete(self, key: str, *, scope: str = "") -> bool:
        check_identity(key, scope)
        self._open()
        existed = self._live((scope, key), time.time()) is not None
        await self._store((scope, key), None)
        return existed

    async def records(
        self,
        *,
        scope: str | None = None,
        state: RecordState | str | None = None,
        older_than: float | None = None,
        limit: int = 100,
    ) -> AsyncIterator[Record]:
        """The optional listing capability (``ListingStore``), by the shared rule."""
        query = RecordQuery.checked(scope, state, older_than, limit)
        self._open()
        now = time.time()
        live = [row.record for i, row in self._rows.items() if self._live(i, now) is not None]
        for record in [r for r in live if query.matches(r, now)][: query.limit]:
            yield record

    async def sweep(self, *, limit: int = 1000) -> int:
        check_limit(limit)
        self._open()
        now = time.time()
        gone = [i for i, row in self._rows.items() if row.record.expires_at <= now][:limit]
        for identity in gone:
            await self._store(identity, None)
        return len(gone)

    async def ping(self) -> None:
        self._open()

    async def close(self) -> None:
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    async def _leave(self, exc: BaseException | None) -> None:
        await self.close()


def _is_duration(value: object) -> bool:
    try:
        check_duration("retention", value)
    except ConfigurationError:
        return False
    return True


@pytest.fixture
def snapshot_store_url() -> str:
    """Every ``open_store("snapshot://")`` is a fresh, empty store."""
    return "snapshot://"


# The one registration: scheme, store class, and the fixture variant the contract suite runs.
ENGINE = register_backend(
    Engine(
        name="snapshot",
        schemes=("snapshot",),
        store=f"{__name__}:SnapshotStore",
        variants=(FixtureVariant("snapshot", "snapshot_store_url", cross_process=False),),
        fixture_module=__name__,
    )
)
