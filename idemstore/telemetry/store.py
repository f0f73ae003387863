"""A store wrapper that records a span and metrics around every operation of the store it wraps.

It changes no result and no error: every call is forwarded as is, and whatever the wrapped store
returns or raises is what the caller sees. Attributes it does not define (``stats``, engine
specifics) are read from the wrapped store.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, TypeVar, cast

from opentelemetry.trace import StatusCode

from idemstore.protocol import ForwardingStore, Status, answers_inline
from idemstore.telemetry.attributes import (
    BACKEND,
    ERROR_TYPE,
    FENCE,
    OPERATION,
    OUTCOME,
    RESERVE_OUTCOME,
    SWEEP_REMOVED,
    TAKEOVER,
    WAIT_OUTCOME,
    backend_name,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from opentelemetry.trace import Span

    from idemstore.protocol import (
        IdempotencyStore,
        Lease,
        Record,
        Reservation,
        SettlesInTransaction,
    )
    from idemstore.telemetry.instruments import Instruments

__all__ = ["InstrumentedStore"]

T = TypeVar("T")


class InstrumentedStore(ForwardingStore):
    """``IdempotencyStore`` that forwards to ``wrapped`` and records into ``instruments``."""

    __slots__ = ("_base", "backend", "instruments")

    def __init__(
        self, wrapped: IdempotencyStore, instruments: Instruments, *, backend: str | None = None
    ) -> None:
        super().__init__(wrapped)
        self.instruments = instruments
        self.backend = backend or backend_name(wrapped)
        self._base: dict[str, Any] = {BACKEND: self.backend}

    @property
    def answers_inline(self) -> bool:
        """The wrapped store's declaration: recording adds no step that suspends."""
        return answers_inline(self.wrapped)

    async def _observe(
        self,
        operation: str,
        call: Awaitable[T],
        describe: Callable[[T, Span], None],
        key: object = None,
        scope: object = None,
    ) -> T:
        """Await ``call`` under a span named after ``operation`` and time it; ``describe``
        then sets the outcome attributes on the span (and may count it)."""
        instruments = self.instruments
        attributes = {**self._base, OPERATION: operation}
        span_attributes = dict(attributes)
        instruments.key_attributes(span_attributes, key, scope)
        with instruments.start_span(f"idemstore {operation}", span_attributes) as span:
            started = time.perf_counter()
            try:
                result = await call
            except BaseException as exc:
                error = type(exc).__qualname__
                attributes[ERROR_TYPE] = error
                instruments.record_operation(attributes, started)
                span.set_attribute(ERROR_TYPE, error)
                # The type only: an exception's text may quote a key or a response.
                span.set_status(StatusCode.ERROR, error)
                raise
            instruments.record_operation(attributes, started)
            describe(result, span)
        return result

    def _settling(
        self, operation: str, outcome: str, lease: Lease
    ) -> Callable[[object, Span], None]:
        """What ``complete``, ``complete_within``, ``release`` and ``extend`` (answering False
        or None when the lease was lost) write on the span."""

        def describe(answer: object, span: Span) -> None:
            span.set_attribute(FENCE, lease.fence)
            if answer is False or answer is None:
                self._fenced(operation, span)
            else:
                span.set_attribute(OUTCOME, outcome)

        return describe

    def _fenced(self, operation: str, span: Span) -> None:
        span.set_attribute(OUTCOME, "fenced_out")
        self.instruments.fenced_out.add(1, {**self._base, OPERATION: operation})

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        def describe(reservation: Reservation, span: Span) -> None:
            found = reservation.lease or reservation.record
            outcome = reservation.outcome.value
            span.set_attributes({OUTCOME: outcome, TAKEOVER: reservation.takeover})
            if found is not None:
                span.set_attribute(FENCE, found.fence)
            self.instruments.reserve_outcomes.add(
                1, {**self._base, RESERVE_OUTCOME: outcome, TAKEOVER: reservation.takeover}
            )

        call = self.wrapped.reserve(
            key, fingerprint, scope=scope, lease_ttl=lease_ttl, retention=retention
        )
        return await self._observe("reserve", call, describe, key, scope)

    async def _complete(self, lease: Lease, response: bytes, retention: float | None) -> bool:
        describe = self._settling("complete", "completed", lease)
        call = self.wrapped.complete(lease, response, retention=retention)
        return await self._observe("complete", call, describe, lease.key, lease.scope)

    async def complete_within(
        self, connection: object, lease: Lease, response: bytes, retention: float
    ) -> bool:
        """The wrapped store's ``complete_within`` (``SettlesInTransaction``), recorded as the
        ``complete_within`` operation: it runs inside the caller's transaction, so its time
        is not that of a ``complete``, which commits."""
        describe = self._settling("complete_within", "completed", lease)
        settles = cast("SettlesInTransaction", self.wrapped)
        call = settles.complete_within(connection, lease, response, retention)
        return await self._observe("complete_within", call, describe, lease.key, lease.scope)

    async def _release(self, lease: Lease) -> bool:
        describe = self._settling("release", "released", lease)
        call = self.wrapped.release(lease)
        return await self._observe("release", call, describe, lease.key, lease.scope)

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        describe = self._settling("extend", "extended", lease)
        call = self.wrapped.extend(lease, lease_ttl=lease_ttl)
        return await self._observe("extend", call, describe, lease.key, lease.scope)

    async def _get(self, key: str, scope: str) -> Record | None:
        def describe(record: Record | None, span: Span) -> None:
            span.set_attribute(OUTCOME, "absent" if record is None else record.status.value)
            if record is not None:
                span.set_attribute(FENCE, record.fence)

        return await self._observe("get", self.wrapped.get(key, scope=scope), describe, key, scope)

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        # The clock wait measures its timeout on (the loop's, monotonic); whether a lease ran
        # is the engine's to say, by its clock, never this machine's wall clock.
        clock = asyncio.get_running_loop().time
        started = clock()

        def describe(record: Record | None, span: Span) -> None:
            waited = clock() - started
            # wait returns early once no live lease holds the key (by the engine's clock);
            # one that returns the key still in progress after its timeout ran out of time.
            timed_out = (
                record is not None and record.status is Status.IN_PROGRESS and waited >= timeout
            )
            outcome = "timeout" if timed_out else "settled"
            span.set_attribute(OUTCOME, outcome)
            self.instruments.wait_duration.record(waited, {**self._base, WAIT_OUTCOME: outcome})
            if timed_out:
                self.instruments.wait_timeouts.add(1, self._base)

        call = self.wrapped.wait(key, scope=scope, timeout=timeout)
        return await self._observe("wait", call, describe, key, scope)

    async def _delete(self, key: str, scope: str) -> bool:
        def describe(deleted: bool, span: Span) -> None:
            span.set_attribute(OUTCOME, "deleted" if deleted else "absent")

        call = self.wrapped.delete(key, scope=scope)
        return await self._observe("delete", call, describe, key, scope)

    async def _sweep(self, limit: int) -> int:
        def describe(removed: int, span: Span) -> None:
            span.set_attribute(SWEEP_REMOVED, removed)
            if removed:
                self.instruments.swept.add(removed, self._base)

        return await self._observe("sweep", self.wrapped.sweep(limit=limit), describe)

    async def ping(self) -> None:
        await self._observe("ping", self.wrapped.ping(), _nothing)


def _nothing(result: object, span: Span) -> None:
    """``describe`` for operations whose only outcome is not raising."""
