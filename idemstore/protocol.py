"""The store contract as Python types: what every backend returns and accepts.

Times are UNIX epoch seconds (floats) from the clock that decides leases: the engine's own
where it has one (Postgres, Redis), the local one otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from idemstore.records import RecordState

__all__ = [
    "AsyncContext",
    "Checkpoint",
    "CheckpointingStore",
    "CheckpointsInTransaction",
    "ForwardingStore",
    "IdempotencyStore",
    "Lease",
    "ListingStore",
    "Outcome",
    "Record",
    "Reservation",
    "SettlesInTransaction",
    "Status",
    "answers_inline",
    "offers",
]


class Status(enum.StrEnum):
    """Where a live record stands."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class Outcome(enum.StrEnum):
    """The one outcome of ``reserve``."""

    ACQUIRED = "acquired"
    COMPLETED = "completed"
    IN_PROGRESS = "in_progress"
    MISMATCH = "mismatch"


# Record, Lease and Reservation are frozen dataclasses with their own ``__init__``: every
# store operation builds one or two, and the generated frozen ``__init__`` pays a lookup and a
# call of ``object.__setattr__`` per field (about 0.15 µs each, more than a memory store's
# whole dict insert). Each ``__init__`` below writes its slots through the slot descriptors
# instead; equality, hashing, ``repr``, ``replace`` and immutability stay the dataclass's.


def _slot_writers(cls: type) -> tuple[Any, ...]:
    """The ``__set__`` of each field's slot descriptor, in field order (they bypass the
    frozen class's ``__setattr__``, as the generated ``__init__`` does)."""
    return tuple(cls.__dict__[field.name].__set__ for field in fields(cls))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A recovery point: a step of the work its owner recorded as done, with its ``data``."""

    name: str
    data: bytes = b""


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """A live record as a store read it.

    ``response`` is set only when ``status`` is completed; ``lease_expires_at`` only while in
    progress. ``checkpoints`` are the recovery points its owners recorded, oldest first (kept
    through takeovers and completion, cleared when a key is acquired afresh).
    """

    scope: str
    key: str
    fingerprint: str
    status: Status
    token: str
    fence: int
    response: bytes | None
    created_at: float
    expires_at: float
    lease_expires_at: float | None
    checkpoints: tuple[Checkpoint, ...] = ()

    def __init__(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        status: Status,
        token: str,
        fence: int,
        response: bytes | None,
        created_at: float,
        expires_at: float,
        lease_expires_at: float | None,
        checkpoints: tuple[Checkpoint, ...] = (),
    ) -> None:
        w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10 = _RECORD_WRITERS
        w0(self, scope)
        w1(self, key)
        w2(self, fingerprint)
        w3(self, status)
        w4(self, token)
        w5(self, fence)
        w6(self, response)
        w7(self, created_at)
        w8(self, expires_at)
        w9(self, lease_expires_at)
        w10(self, checkpoints)


@dataclass(frozen=True, slots=True, init=False)
class Lease:
    """Proof of ownership of a key: pass it to ``complete``, ``release`` or ``extend``.

    ``retention`` is the retention asked for at ``reserve``; ``complete`` uses it by default.
    """

    scope: str
    key: str
    token: str
    fence: int
    lease_expires_at: float
    retention: float

    def __init__(
        self,
        scope: str,
        key: str,
        token: str,
        fence: int,
        lease_expires_at: float,
        retention: float,
    ) -> None:
        w0, w1, w2, w3, w4, w5 = _LEASE_WRITERS
        w0(self, scope)
        w1(self, key)
        w2(self, token)
        w3(self, fence)
        w4(self, lease_expires_at)
        w5(self, retention)


@dataclass(frozen=True, slots=True, init=False)
class Reservation:
    """What ``reserve`` found: ``lease`` when acquired, ``record`` (the existing one) otherwise.

    ``checkpoints``: on a takeover, the recovery points the record kept (``()`` otherwise).
    """

    outcome: Outcome
    lease: Lease | None = None
    record: Record | None = None
    takeover: bool = False
    checkpoints: tuple[Checkpoint, ...] = ()

    def __init__(
        self,
        outcome: Outcome,
        lease: Lease | None = None,
        record: Record | None = None,
        takeover: bool = False,
        checkpoints: tuple[Checkpoint, ...] = (),
    ) -> None:
        w0, w1, w2, w3, w4 = _RESERVATION_WRITERS
        w0(self, outcome)
        w1(self, lease)
        w2(self, record)
        w3(self, takeover)
        w4(self, checkpoints)

    @property
    def acquired(self) -> bool:
        return self.outcome is Outcome.ACQUIRED


_RECORD_WRITERS = _slot_writers(Record)
_LEASE_WRITERS = _slot_writers(Lease)
_RESERVATION_WRITERS = _slot_writers(Reservation)


@runtime_checkable
class IdempotencyStore(Protocol):
    """An async store of idempotency records. See docs/semantics.md for the full contract."""

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        """Atomically claim ``(scope, key)`` or report the live record that prevents it."""
        ...

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        """Store the response; ``False`` (nothing written) when the lease was fenced out."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the key up so the next ``reserve`` acquires it with a higher fence."""
        ...

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        """Push the lease deadline to now + ``lease_ttl``; ``None`` when the lease was lost."""
        ...

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        """The live record, or ``None`` when absent, released or past retention."""
        ...

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        """Return once no live lease holds the key, or after ``timeout`` seconds."""
        ...

    async def delete(self, key: str, *, scope: str = "") -> bool:
        """Remove the record whatever its state; ``True`` when there was one."""
        ...

    async def sweep(self, *, limit: int = 1000) -> int:
        """Physically remove up to ``limit`` records past retention; return how many."""
        ...

    async def ping(self) -> None:
        """Raise ``StoreUnavailableError`` unless the engine answers."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class CheckpointingStore(IdempotencyStore, Protocol):
    """An ``IdempotencyStore`` that also records recovery points: an optional capability.

    A store without ``checkpoint`` still satisfies ``IdempotencyStore``; only
    ``Execution.checkpoint`` needs this, and refuses a store that lacks it with a
    ``ConfigurationError``. A store that has it keeps each record's checkpoints in
    ``Record.checkpoints`` and hands them to a takeover in ``Reservation.checkpoints``.
    """

    async def checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        """Append ``Checkpoint(name, data)`` to the record ``lease`` holds; ``False``
        (nothing written) when the lease was fenced out (the owner check of ``complete``)."""
        ...


@runtime_checkable
class ListingStore(Protocol):
    """A store that can list its live records, for operators (``idemstore keys``): an
    optional capability, offered by every built-in store. ``records`` reads the engine
    (a scan where it cannot query: Redis, DynamoDB), never the hot path's structures, and
    never returns a released record or one past retention."""

    def records(
        self,
        *,
        scope: str | None = None,
        state: RecordState | str | None = None,
        older_than: float | None = None,
        limit: int = 100,
    ) -> AsyncIterator[Record]:
        """At most ``limit`` live records, in no promised order: of ``scope`` (``None``: all
        scopes), in ``state`` (``in_progress``, ``stuck``: lease past its deadline with no
        outcome, ``completed``; ``None``: any), created more than ``older_than`` seconds
        ago; states and ages by the engine's clock (``idemstore.records.RecordQuery``)."""
        ...


class AsyncContext:
    """``async with`` written once, for a store or anything else with a lifecycle: entering
    runs the ``_enter`` hook and returns the object, leaving runs ``_leave`` with the exception
    the body raised (``None`` when it finished). A store that subclasses it writes
    ``_leave`` as ``await self.close()``; it is a mixin, never part of the Protocol."""

    __slots__ = ()

    async def __aenter__(self) -> Self:
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._leave(exc)

    async def _enter(self) -> None:
        """What entering does before the body (nothing by default)."""

    async def _leave(self, exc: BaseException | None) -> None:
        """What leaving does; ``exc`` is what the body raised, ``None`` when it finished."""
        raise NotImplementedError


class ForwardingStore(AsyncContext):
    """A store that forwards every operation, ``close`` and ``async with`` to the store it
    wraps, ``wrapped``; attributes it does not define (``stats``, engine specifics) are read
    from ``wrapped`` too. It is the base of wrappers that change a few operations
    (``idemstore.instrument()``'s, ``CachedStore``, the test stores): each public operation
    calls a hook that takes its arguments in order (``_reserve(key, fingerprint, scope,
    lease_ttl, retention)``, ``_wait(key, scope, timeout)``, ...) and forwards them, so a
    wrapper overrides only the hooks of what it changes. ``ping`` and ``close`` take no
    arguments and are overridden as they are.

    Like any base class, it never passes on ``answers_inline``: a wrapper that keeps the
    promise declares it itself (see ``answers_inline``).
    """

    __slots__ = ("wrapped",)

    def __init__(self, wrapped: IdempotencyStore) -> None:
        self.wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.wrapped!r})"

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        return await self._reserve(key, fingerprint, scope, lease_ttl, retention)

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        return await self._complete(lease, response, retention)

    async def release(self, lease: Lease) -> bool:
        return await self._release(lease)

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        return await self._extend(lease, lease_ttl)

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        return await self._get(key, scope)

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        return await self._wait(key, scope, timeout)

    async def delete(self, key: str, *, scope: str = "") -> bool:
        return await self._delete(key, scope)

    async def sweep(self, *, limit: int = 1000) -> int:
        return await self._sweep(limit)

    async def ping(self) -> None:
        await self.wrapped.ping()

    async def close(self) -> None:
        await self.wrapped.close()

    # -- hooks: each forwards its operation as it is ----------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        return await self.wrapped.reserve(
            key, fingerprint, scope=scope, lease_ttl=lease_ttl, retention=retention
        )

    async def _complete(self, lease: Lease, response: bytes, retention: float | None) -> bool:
        return await self.wrapped.complete(lease, response, retention=retention)

    async def _release(self, lease: Lease) -> bool:
        return await self.wrapped.release(lease)

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        return await self.wrapped.extend(lease, lease_ttl=lease_ttl)

    async def _get(self, key: str, scope: str) -> Record | None:
        return await self.wrapped.get(key, scope=scope)

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        return await self.wrapped.wait(key, scope=scope, timeout=timeout)

    async def _delete(self, key: str, scope: str) -> bool:
        return await self.wrapped.delete(key, scope=scope)

    async def _sweep(self, limit: int) -> int:
        return await self.wrapped.sweep(limit=limit)

    async def _enter(self) -> None:
        await self.wrapped.__aenter__()

    async def _leave(self, exc: BaseException | None) -> None:
        if exc is None:
            await self.wrapped.__aexit__(None, None, None)
        else:
            await self.wrapped.__aexit__(type(exc), exc, exc.__traceback__)


def offers(store: object, capability: type) -> bool:
    """Whether ``store`` offers ``capability`` (a runtime-checkable Protocol), itself or
    through the stores its ``ForwardingStore`` wrappers forward to. ``isinstance`` alone does
    not see forwarded methods from Python 3.12 on: it reads a Protocol's attributes
    statically, and a wrapper forwards them through ``__getattr__``."""
    while not isinstance(store, capability):
        if not isinstance(store, ForwardingStore):
            return False
        store = store.wrapped
    return True


def answers_inline(store: object) -> bool:
    """Whether ``store``'s own class declares ``answers_inline = True``: its ``reserve``,
    ``complete``, ``release`` and ``extend`` finish without ever suspending (no I/O, as a dict
    in this process).

    The execution path then awaits them in place: no cancellation can land inside such a call,
    so it needs no task to shield it, and a call costs no turn of the event loop. A store that
    does any I/O must not declare it. Only the class itself counts, never a base class nor an
    attribute a wrapper forwards: a subclass or wrapper that adds a suspending step must not
    inherit the promise. A wrapper that does keep it declares a property returning a bool
    (``idemstore.instrument()``'s passes on the wrapped store's declaration).
    """
    declared = type(store).__dict__.get("answers_inline", False)
    if isinstance(declared, property) and declared.fget is not None:
        return declared.fget(store) is True
    return declared is True


@runtime_checkable
class SettlesInTransaction(Protocol):
    """A store whose completion can run inside a transaction of the caller's connection."""

    async def check_connection(self, connection: object) -> None:
        """``ConfigurationError`` unless ``connection`` is this store's engine, reaches the
        store's database, and has a transaction open. Writes nothing."""
        ...

    async def complete_within(
        self, connection: object, lease: Lease, response: bytes, retention: float
    ) -> bool:
        """``complete``'s fenced statement on ``connection`` (checked by ``check_connection``),
        in its open transaction: ``False`` when the fence no longer holds."""
        ...


@runtime_checkable
class CheckpointsInTransaction(Protocol):
    """A store whose checkpoint can run inside a transaction of the caller's connection."""

    async def check_connection(self, connection: object) -> None: ...

    async def checkpoint_within(
        self, connection: object, lease: Lease, name: str, data: bytes
    ) -> bool:
        """``checkpoint``'s fenced statement on ``connection``, in its open transaction:
        ``False`` when the fence no longer holds."""
        ...
