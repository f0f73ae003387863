"""What every store does around its engine calls, written once: the envelope of a store.

A backend subclasses ``StoreEnvelope`` (engines reached through I/O) or
``InlineStoreEnvelope`` (stores whose operations never suspend, such as the memory store) and
writes only the engine's hooks, aiocache-style: the public ``get`` checks and calls ``_get``.
Outside authors may still implement ``IdempotencyStore`` directly; the Protocol stays the
contract.

What a subclass may rely on:

- every public operation runs in one fixed order: **validate the arguments, then check that
  the store is open, then call the hook** (the only I/O). A bad argument raises the same
  error on a closed store as on an open one; a forged lease owns nothing (``complete`` and
  ``release`` return False, ``extend`` None) without asking the engine or the closed flag;
  good arguments on a closed store raise ``RuntimeError`` naming the store closed;
- hooks get checked arguments: durations as floats, the response as bytes, the retention to
  keep it for, and only leases that could have been issued;
- ``close()`` runs the ``_shut`` hook once (later calls return at once); ``async with``
  enters through the ``_enter`` hook and closes the store when entering fails;
- ``StoreEnvelope._connect()`` opens the engine connection once, under a lock, and never
  leaves one behind when ``close()`` ran while it was being opened;
- ``checkpoint`` (recovery points) checks the name and data against
  ``idemstore.checkpoints``' limits before anything else, and calls ``_checkpoint``;
- ``lost_reserve`` classifies a reserve that found a live record it may not take.

The operations are written once for both envelopes. They add no await, task or lock: an
operation awaits its hook's answer only when the hook returned an awaitable, so
``InlineStoreEnvelope``'s plain hooks are called in place and the memory store keeps its
``answers_inline`` promise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Generic, Self, TypeVar

from idemstore.backends.arguments import (
    complete_arguments,
    lease_arguments,
    lookup_arguments,
    reserve_arguments,
    wait_arguments,
)
from idemstore.backends.stats import DEFAULT_LIMIT
from idemstore.checkpoints import check_checkpoint
from idemstore.errors import ConfigurationError
from idemstore.protocol import AsyncContext, Lease, Outcome, Record, Reservation, Status
from idemstore.records import RecordQuery, check_duration, check_limit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from idemstore.backends.stats import StoreStats
    from idemstore.records import RecordState

__all__ = ["InlineStoreEnvelope", "StoreEnvelope", "lost_reserve"]

C = TypeVar("C")
T = TypeVar("T")

_MISMATCH = Outcome.MISMATCH
_COMPLETED = Outcome.COMPLETED
_IN_PROGRESS = Outcome.IN_PROGRESS
_DONE = Status.COMPLETED


def lost_reserve(record: Record, fingerprint: str) -> Reservation:
    """The outcome of a reserve that found ``record`` live and could not take it: another
    fingerprint is a mismatch (never a takeover), else completed or in progress."""
    if record.fingerprint != fingerprint:
        return Reservation(_MISMATCH, None, record, False)
    if record.status is _DONE:
        return Reservation(_COMPLETED, None, record, False)
    return Reservation(_IN_PROGRESS, None, record, False)


# Leases remembered as handed out, at most: far more than are in flight at once. Leases
# never given back through complete or release (held after a failure, lapsed, completed
# within the caller's transaction) fill it; past it the memory starts over, and a lease it
# forgot is checked in full, as any other.
_MAX_HANDED = 4096


class _Envelope(AsyncContext):
    """Lifecycle, the closed check, and the operations whose hooks always await."""

    __slots__ = ("_closed", "_handed", "_max_key_length")

    def __init__(self, *, max_key_length: int) -> None:
        self._max_key_length = max_key_length
        self._closed = False
        # The leases this store handed out and nobody has given back yet, by id(): the very
        # objects (Lease is frozen), so complete, release and extend skip the owner checks of
        # lease_owns_nothing for them. None: the subclass knows its leases itself (_issued).
        self._handed: dict[int, Lease] | None = {}

    def _hand_out(self, lease: Lease) -> None:
        handed = self._handed
        if handed is not None:
            if len(handed) >= _MAX_HANDED:
                handed.clear()  # leases never given back (abandoned): start over
            handed[id(lease)] = lease

    def _take_back(self, lease: Lease) -> None:
        handed = self._handed
        if handed is not None and handed.get(id(lease)) is lease:
            del handed[id(lease)]

    # -- lifecycle ------------------------------------------------------------------------

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"this {type(self).__name__} is closed")

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    async def close(self) -> None:
        """Release connections; idempotent. The store is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        await self._shut()

    async def __aenter__(self) -> Self:
        try:
            await self._enter()
        except BaseException:
            # __aexit__ will not run: close here, or a connection (and its thread or
            # socket) outlives the failed entry.
            await self.close()
            raise
        return self

    async def _leave(self, exc: BaseException | None) -> None:
        await self.close()

    def _no_checkpoints(self) -> ConfigurationError:
        # The default hook: a subclass written before recovery points existed still works,
        # and says so clearly when asked for one.
        return ConfigurationError(
            f"this store ({type(self).__name__}) does not support checkpoints: its class"
            " writes no `_checkpoint` hook"
        )

    def _issued(self, lease: Lease) -> bool:
        """Whether this store is known to have handed out this very ``lease`` object (then
        it needs none of ``lease_owns_nothing``'s checks)."""
        handed = self._handed
        return handed is not None and handed.get(id(lease)) is lease

    def _owns_nothing(self, lease: Lease) -> bool:
        """Whether no store could have issued ``lease`` (see ``lease_owns_nothing``)."""
        if self._issued(lease):
            return False
        return not lease_arguments(lease, max_key_length=self._max_key_length)

    # -- operations whose hooks await on every store ------------------------------------

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        timeout = wait_arguments(key, scope, timeout, max_key_length=self._max_key_length)
        if self._closed:
            raise self._closed_error()
        return await self._wait(key, scope, timeout)

    async def ping(self) -> None:
        if self._closed:
            raise self._closed_error()
        await self._ping()

    async def stats(self, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
        """Count records by state (``idemstore stats``); where the engine cannot count, read
        at most ``limit`` records. How the engine counted, and what it cost, is in
        ``StoreStats.method``."""
        limit = check_limit(limit)
        if self._closed:
            raise self._closed_error()
        return await self._stats(limit)

    async def records(
        self,
        *,
        scope: str | None = None,
        state: RecordState | str | None = None,
        older_than: float | None = None,
        limit: int = 100,
    ) -> AsyncIterator[Record]:
        """At most ``limit`` live records matching the filters (``ListingStore``); the
        ``_records`` hook yields the matching ones, in pages it reads as it goes."""
        query = RecordQuery.checked(scope, state, older_than, limit)
        if self._closed:
            raise self._closed_error()
        listed = 0
        pages = self._records(query)
        try:
            async for record in pages:
                yield record
                listed += 1
                if listed >= query.limit:
                    return
        finally:
            if isinstance(pages, AsyncGenerator):
                await pages.aclose()  # the hook's finally runs now, not when collected

    # -- the contract ---------------------------------------------------------------------
    #
    # Written once for both envelopes: a hook answers in place (InlineStoreEnvelope) or with
    # an awaitable (StoreEnvelope). The answer's type tells which, so an inline store's
    # operation awaits nothing of the envelope's.

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        lease_ttl, retention = reserve_arguments(
            key, fingerprint, scope, lease_ttl, retention, max_key_length=self._max_key_length
        )
        if self._closed:
            raise self._closed_error()
        answer = self._reserve(key, fingerprint, scope, lease_ttl, retention)
        reservation = answer if isinstance(answer, Reservation) else await answer
        if reservation.lease is not None:
            self._hand_out(reservation.lease)
        return reservation

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        checked = complete_arguments(
            lease,
            response,
            retention,
            max_key_length=self._max_key_length,
            issued=self._issued(lease),
        )
        if checked is None:
            return False
        if self._closed:
            raise self._closed_error()
        answer = self._complete(lease, checked[0], checked[1])
        done = answer if isinstance(answer, bool) else await answer
        self._take_back(lease)
        return done

    async def release(self, lease: Lease) -> bool:
        if self._owns_nothing(lease):
            return False
        if self._closed:
            raise self._closed_error()
        answer = self._release(lease)
        done = answer if isinstance(answer, bool) else await answer
        self._take_back(lease)
        return done

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        if self._owns_nothing(lease):
            return None
        if self._closed:
            raise self._closed_error()
        answer = self._extend(lease, lease_ttl)
        extended = answer if answer is None or isinstance(answer, Lease) else await answer
        if extended is not None:
            # The old lease still owns the key; given again, it is checked as any other.
            self._take_back(lease)
            self._hand_out(extended)
        return extended

    async def checkpoint(self, lease: Lease, name: str, data: bytes = b"") -> bool:
        """Append a recovery point to the record ``lease`` holds (``CheckpointingStore``)."""
        data = check_checkpoint(name, data)
        if self._owns_nothing(lease):
            return False
        if self._closed:
            raise self._closed_error()
        answer = self._checkpoint(lease, name, data)
        return answer if isinstance(answer, bool) else await answer

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        lookup_arguments(key, scope, max_key_length=self._max_key_length)
        if self._closed:
            raise self._closed_error()
        answer = self._get(key, scope)
        return answer if answer is None or isinstance(answer, Record) else await answer

    async def delete(self, key: str, *, scope: str = "") -> bool:
        lookup_arguments(key, scope, max_key_length=self._max_key_length)
        if self._closed:
            raise self._closed_error()
        answer = self._delete(key, scope)
        return answer if isinstance(answer, bool) else await answer

    async def sweep(self, *, limit: int = 1000) -> int:
        limit = check_limit(limit)
        if self._closed:
            raise self._closed_error()
        answer = self._sweep(limit)
        return answer if isinstance(answer, int) else await answer

    # -- hooks ----------------------------------------------------------------------------
    #
    # The operations' hooks get checked arguments. StoreEnvelope's are coroutines;
    # InlineStoreEnvelope's are plain functions that never suspend.

    def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation | Awaitable[Reservation]:
        raise NotImplementedError

    def _complete(self, lease: Lease, response: bytes, retention: float) -> bool | Awaitable[bool]:
        raise NotImplementedError

    def _release(self, lease: Lease) -> bool | Awaitable[bool]:
        raise NotImplementedError

    def _extend(self, lease: Lease, lease_ttl: float) -> Lease | Awaitable[Lease | None] | None:
        raise NotImplementedError

    def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool | Awaitable[bool]:
        raise self._no_checkpoints()

    def _get(self, key: str, scope: str) -> Record | Awaitable[Record | None] | None:
        raise NotImplementedError

    def _delete(self, key: str, scope: str) -> bool | Awaitable[bool]:
        raise NotImplementedError

    def _sweep(self, limit: int) -> int | Awaitable[int]:
        raise NotImplementedError

    async def _shut(self) -> None:
        """Release what the store holds; run once, by the first ``close()``."""

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        raise NotImplementedError

    async def _ping(self) -> None:
        raise NotImplementedError

    async def _stats(self, limit: int) -> StoreStats:
        raise NotImplementedError

    def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        """The live records ``query`` matches (judged by the engine's clock), any order; the
        envelope stops reading at ``query.limit``."""
        raise ConfigurationError(
            f"this store ({type(self).__name__}) cannot list its records: its class writes"
            " no `_records` hook"
        )


class StoreEnvelope(_Envelope, Generic[C]):
    """The envelope of a store whose engine is reached through I/O on a connection ``C``
    (a connection, a pool, a client), opened on first use by ``_connect()``."""

    __slots__ = ("_connect_lock", "_connection")

    def __init__(self, *, max_key_length: int) -> None:
        super().__init__(max_key_length=max_key_length)
        self._connection: C | None = None
        self._connect_lock = asyncio.Lock()

    async def _connect(self) -> C:
        """The engine connection, opened by ``_open`` on first use: once, under a lock."""
        connection = self._connection
        if connection is not None:
            return connection
        if self._closed:
            raise self._closed_error()
        async with self._connect_lock:
            # close() may have run while this waited for the lock.
            if self._closed:
                raise self._closed_error()
            if self._connection is None:
                self._connection = await self._opened(self._open(), self._discard)
            return self._connection

    async def _opened(self, opening: Awaitable[T], discard: Callable[[T], Awaitable[object]]) -> T:
        """What ``opening`` opened, unless ``close()`` ran meanwhile: then ``discard`` it (it
        would outlive the store) and raise the closed error."""
        made = await opening
        if self._closed:
            with contextlib.suppress(Exception):
                await discard(made)
            raise self._closed_error()
        return made

    async def _shut(self) -> None:
        connection, self._connection = self._connection, None
        await self._disconnect(connection)

    # -- hooks ------------------------------------------------------------------------------

    async def _open(self) -> C:
        """Open the engine connection (cleaning up after itself if that fails)."""
        raise NotImplementedError

    async def _discard(self, connection: C) -> None:
        """Close a connection opened while the store was being closed."""
        raise NotImplementedError

    async def _disconnect(self, connection: C | None) -> None:
        """Close the connection (None when none was opened) and whatever else the store
        holds; run once, by the first ``close()``."""
        raise NotImplementedError


class InlineStoreEnvelope(_Envelope):
    """The envelope of a store that answers without suspending (no I/O): its hooks are plain
    functions, called in place, so no operation but ``wait`` adds a step that could suspend
    (see ``idemstore.protocol.answers_inline``, which the subclass itself must declare)."""

    __slots__ = ()
