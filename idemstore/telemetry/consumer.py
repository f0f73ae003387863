"""The consumer side: one span per keyed call, from ``begin`` until its execution is finished.

``idemstore.execution`` calls in here only after ``instrument()``. The span is current while the
key is reserved (and waited for), so those store spans nest under it; an execution keeps it and
settles or releases under it, so ``complete``/``release`` (and the heartbeat's ``extend``) nest
under it too. The call is counted in ``idemstore.consumer.calls`` once ``begin`` decides.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, StatusCode

from idemstore.errors import ConflictError, InProgressError
from idemstore.execution import Replay
from idemstore.telemetry import backend_name
from idemstore.telemetry.instruments import (
    BACKEND,
    CALL_OUTCOME,
    CONSUMER,
    ERROR_TYPE,
    FENCE,
    OUTCOME,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from opentelemetry.trace import Span

    from idemstore.execution import Execution, ExecutionPolicy
    from idemstore.telemetry.instruments import Instruments

__all__ = ["ExecutionObserver", "observe_begin"]

T = TypeVar("T")

_UNTRACED = contextlib.nullcontext()


async def observe_begin(
    instruments: Instruments,
    policy: ExecutionPolicy,
    begin: Callable[[], Awaitable[Execution | Replay]],
    key: str,
    scope: str,
) -> Execution | Replay:
    """``begin()`` under a new consumer span; counts the call by what ``begin`` decided."""
    # A policy built before instrument() still records: its store is wrapped on first use.
    store = policy.store = instruments.wrap(policy.store)
    consumer = policy.consumer
    attributes: dict[str, Any] = {CONSUMER: consumer, BACKEND: backend_name(store)}
    span: Span = INVALID_SPAN  # counted, not traced, while no tracer provider is configured
    current: AbstractContextManager[Any] = _UNTRACED
    if instruments.tracing():
        span_attributes = dict(attributes)
        instruments.key_attributes(span_attributes, key, scope)
        span = instruments.tracer.start_span(f"idemstore {consumer}", attributes=span_attributes)
        current = trace.use_span(span, record_exception=False, set_status_on_exception=False)
    with current:
        try:
            claim = await begin()
        except BaseException as exc:
            outcome = _refusal(exc)
            attributes[CALL_OUTCOME] = outcome
            if outcome == "error":
                attributes[ERROR_TYPE] = type(exc).__qualname__
                span.set_status(StatusCode.ERROR, type(exc).__qualname__)
            instruments.consumer_calls.add(1, attributes)
            span.set_attributes(attributes)
            span.end()
            raise
    replayed = isinstance(claim, Replay)
    attributes[CALL_OUTCOME] = "replayed" if replayed else "executed"
    instruments.consumer_calls.add(1, attributes)
    if span is INVALID_SPAN:
        return claim
    span.set_attributes({**attributes, FENCE: claim.fence})
    if isinstance(claim, Replay):
        span.end()
    else:
        claim.observer = ExecutionObserver(span)
    return claim


class ExecutionObserver:
    """Keeps an execution's consumer span open until the execution is finished."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    async def finishing(self, state: str, bookkeeping: Coroutine[Any, Any, T]) -> T:
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
                if result is False:
                    state = "not_recorded"  # fenced out, or too large for the store
                span.set_attribute(OUTCOME, state)
            finally:
                span.end()
        return result


def _refusal(exc: BaseException) -> str:
    if isinstance(exc, ConflictError):
        return "conflict"
    if isinstance(exc, InProgressError):
        return "in_progress"
    return "error"
