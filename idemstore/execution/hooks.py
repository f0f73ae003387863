"""What the execution path reports about its work, and the one slot an observer fills.

The execution path (``idemstore.execution``, its heartbeat in
``idemstore.execution.lease_keeping``, and the ``Sweeper``) declares here the points it reports
and asks ``current_observer()`` at each: ``None`` (the fast path, one check per keyed call)
until ``register_observer`` fills the slot. ``idemstore.instrument()`` registers
OpenTelemetry's observer (``idemstore.telemetry``). This module imports neither side, so an
observer depends on it and never on the execution path.

The points, in the order of one keyed call:

- ``store_view(store)``: the store the execution path calls for this policy: one whose
  operations are observed. The caller's store object is never changed or replaced.
- ``call(consumer, store, key, scope)``: a consumer asks for a key; the ``CallObservation``
  it returns is ``reserving()`` while the key is reserved (and waited for), then told what
  ``begin`` decided: ``refused(error)``, ``replayed(fence)`` or ``executing(fence)``.
- ``executing`` may return an ``ExecutionObservation`` whose ``finishing`` wraps the
  execution's last bookkeeping (complete, release, or stopping the heartbeat).
- ``heartbeat_failed(store, failure, error)``: a heartbeat's ``extend`` found the lease lost
  (``"lease_lost"``) or raised (``"store_error"``, with the exception).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from contextlib import AbstractContextManager

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "CallObservation",
    "ExecutionObservation",
    "ExecutionObserver",
    "FinishedState",
    "HeartbeatFailure",
    "current_observer",
    "register_observer",
]

T = TypeVar("T")

FinishedState: TypeAlias = Literal["settled", "released", "held"]
"""How an execution finished, as ``ExecutionObservation.finishing`` is told."""

HeartbeatFailure: TypeAlias = Literal["lease_lost", "store_error"]
"""What made a heartbeat fail: ``extend`` answered that the lease is lost, or it raised."""


class ExecutionObservation(Protocol):
    """One execution this caller owns, from ``begin`` until it is finished."""

    def finishing(
        self, state: FinishedState, bookkeeping: Coroutine[Any, Any, T]
    ) -> Coroutine[Any, Any, T]:
        """``bookkeeping`` (complete, release, or stopping the heartbeat) as observed:
        awaiting the result awaits ``bookkeeping`` and returns or raises what it does. A
        ``False`` result means the outcome was not recorded (fenced out, or too large)."""
        ...


class CallObservation(Protocol):
    """One keyed call of a consumer, from asking for the key to what ``begin`` decided."""

    def reserving(self) -> AbstractContextManager[object]:
        """Entered while the key is reserved and waited for (the store's calls run in it)."""
        ...

    def refused(self, error: BaseException) -> None:
        """``begin`` raised ``error`` (a conflict, the key in progress, a store failure...)."""
        ...

    def replayed(self, fence: int) -> None:
        """``begin`` returned the recorded outcome of the execution under ``fence``."""
        ...

    def executing(self, fence: int) -> ExecutionObservation | None:
        """``begin`` gave this caller the key under ``fence``; ``None``: nothing to observe
        about how the execution finishes."""
        ...


class ExecutionObserver(Protocol):
    """What ``register_observer`` takes: the points the execution path reports."""

    def store_view(self, store: IdempotencyStore) -> IdempotencyStore:
        """``store`` as the execution path should call it (``store`` itself, or a view that
        forwards every call); the same answer for the same store is expected."""
        ...

    def call(self, consumer: str, store: IdempotencyStore, key: str, scope: str) -> CallObservation:
        """A keyed call of ``consumer`` (``ExecutionPolicy.consumer``) begins on ``store``
        (the view ``store_view`` gave)."""
        ...

    def heartbeat_failed(
        self, store: IdempotencyStore, failure: HeartbeatFailure, error: Exception | None
    ) -> None:
        """A heartbeat's ``extend`` on ``store`` failed: ``error`` is what it raised
        (``"store_error"``), ``None`` when it answered that the lease is lost."""
        ...


_observer: ExecutionObserver | None = None


def register_observer(observer: ExecutionObserver | None) -> None:
    """Report to ``observer`` from now on (``None``: to nobody). One slot: the last wins."""
    global _observer
    _observer = observer


def current_observer() -> ExecutionObserver | None:
    """The registered observer, or ``None`` when nobody observes (the fast path)."""
    return _observer
