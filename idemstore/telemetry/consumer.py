"""The consumer side: what the execution path reports, recorded as spans and metrics.

``instrument()`` registers a ``ConsumerObserver`` with ``idemstore.execution.hooks``; the
execution path reports to it and this module knows nothing of the execution path itself.

One span per keyed call, from ``begin`` until its execution is finished. The span is current
while the key is reserved (and waited for), so those store spans nest under it; an execution
keeps it and settles or releases under it, so ``complete``/``release`` (and the heartbeat's
``extend``) nest under it too. The call is counted in ``idemstore.consumer.calls`` once
``begin`` decides; a failing heartbeat in ``idemstore.heartbeat.failures``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, StatusCode

from idemstore.errors import ConflictError, InProgressError
from idemstore.telemetry.attributes import (
    BACKEND,
    CALL_OUTCOME,
    CONSUMER,
    ERROR_TYPE,
    FENCE,
    HEARTBEAT_FAILURE,
    OUTCOME,
    backend_name,
)

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from contextlib import AbstractContextManager

    from opentelemetry.trace import Span

    from idemstore.execution.hooks import FinishedState, HeartbeatFailure
    from idemstore.protocol import IdempotencyStore
    from idemstore.telemetry.instruments import Instruments

__all__ = ["ConsumerCall", "ConsumerObserver", "ExecutionSpan"]

T = TypeVar("T")

_UNTRACED = contextlib.nullcontext()


class ConsumerObserver:
    """The ``idemstore.execution.hooks.ExecutionObserver`` that records into ``instruments``."""

    __slots__ = ("_last", "instruments")

    def __init__(self, instruments: Instruments) -> None:
        self.instruments = instruments
        # The last store asked about and its view, in one tuple (swapped whole, so a reader
        # in another thread never pairs one store with another's view): most applications
        # run one store, and the view is asked for on every call.
        self._last: tuple[IdempotencyStore, IdempotencyStore] | None = None

    def store_view(self, store: IdempotencyStore) -> IdempotencyStore:
        """``store`` recording into the instruments: a wrapper around it (``store`` itself
        when it already records there); ``store`` is not changed."""
        last = self._last
        if last is not None and last[0] is store:
            return last[1]
        view = self.instruments.wrap(store)
        self._last = (store, view)
        return view

    def call(self, consumer: str, store: IdempotencyStore, key: str, scope: str) -> ConsumerCall:
        return ConsumerCall(self.instruments, consumer, store, key, scope)

    def heartbeat_failed(
        self, store: IdempotencyStore, failure: HeartbeatFailure, error: Exception | None
    ) -> None:
        attributes = {BACKEND: backend_name(store), HEARTBEAT_FAILURE: failure}
        if error is not None:
            attributes[ERROR_TYPE] = type(error).__qualname__
        self.instruments.heartbeat_failures.add(1, attributes)


class ConsumerCall:
    """One keyed call: its consumer span (when spans go anywhere) and its count."""

    __slots__ = ("_attributes", "_instruments", "_span")

    def __init__(
        self, instruments: Instruments, consumer: str, store: IdempotencyStore, key: str, scope: str
    ) -> None:
        self._instruments = instruments
        self._attributes: dict[str, Any] = {CONSUMER: consumer, BACKEND: backend_name(store)}
        # Counted, not traced, while no tracer provider is configured.
        self._span: Span = INVALID_SPAN
        if instruments.tracing():
            span_attributes = dict(self._attributes)
            instruments.key_attributes(span_attributes, key, scope)
            self._span = instruments.tracer.start_span(
                f"idemstore {consumer}", attributes=span_attributes
            )

    def reserving(self) -> AbstractContextManager[object]:
        if self._span is INVALID_SPAN:
            return _UNTRACED
        return trace.use_span(self._span, record_exception=False, set_status_on_exception=False)

    def refused(self, error: BaseException) -> None:
        attributes, span = self._attributes, self._span
        outcome = _refusal(error)
        attributes[CALL_OUTCOME] = outcome
        if outcome == "error":
            attributes[ERROR_TYPE] = type(error).__qualname__
            span.set_status(StatusCode.ERROR, type(error).__qualname__)
        self._instruments.consumer_calls.add(1, attributes)
        span.set_attributes(attributes)
        span.end()

    def replayed(self, fence: int) -> None:
        self._decided("replayed", fence)
        self._span.end()

    def executing(self, fence: int) -> ExecutionSpan | None:
        self._decided("executed", fence)
        return None if self._span is INVALID_SPAN else ExecutionSpan(self._span)

    def _decided(self, outcome: str, fence: int) -> None:
        attributes = self._attributes
        attributes[CALL_OUTCOME] = outcome
        self._instruments.consumer_calls.add(1, attributes)
        if self._span is not INVALID_SPAN:
            self._span.set_attributes({**attributes, FENCE: fence})


class ExecutionSpan:
    """Keeps an execution's consumer span open until the execution is finished."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    async def finishing(self, state: FinishedState, bookkeeping: Coroutine[Any, Any, T]) -> T:
        """Await ``bookkeeping`` (complete, release, or stopping the heartbeat) under the
        span, then end it with the execution's final ``state``."""
        span = self.span
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            try:
                result = await bookkeeping
            except BaseException as exc:
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, type(exc).__qualname__)
                raise
            else:
                outcome: str = state
                if result is False:
                    outcome = "not_recorded"  # fenced out, or too large for the store
                span.set_attribute(OUTCOME, outcome)
            finally:
                span.end()
        return result


def _refusal(exc: BaseException) -> str:
    if isinstance(exc, ConflictError):
        return "conflict"
    if isinstance(exc, InProgressError):
        return "in_progress"
    return "error"
