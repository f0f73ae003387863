"""How a key is executed at most once: ``ExecutionPolicy`` (the choices consumers differ in),
its ``begin`` (reserve, wait, replay or own) and ``run``, and what they return (``Replay``,
``Result``). The execution a caller owns is ``idemstore.execution.state_machine.Execution``."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from idemstore.errors import ConfigurationError, ConflictError, InProgressError
from idemstore.execution.hooks import current_observer
from idemstore.execution.lease_keeping import give_up_late_lease, reserve_cancel_safe, shielded
from idemstore.execution.outcome_markers import record_outcome_unknown, replayed_response
from idemstore.execution.running_work import refuse_plain_function, running
from idemstore.execution.state_machine import Execution
from idemstore.protocol import Outcome
from idemstore.records import check_duration

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from idemstore.protocol import IdempotencyStore, Record

__all__ = ["ExecutionPolicy", "FailurePolicy", "Replay", "Result", "TakeoverPolicy"]

logger = logging.getLogger("idemstore.execution")

FailurePolicy: TypeAlias = Literal["release", "hold"] | Callable[[Exception], bytes | None]
"""What ``on_failure`` accepts (see ``ExecutionPolicy``)."""

TakeoverPolicy: TypeAlias = Literal["run", "refuse"]
"""What ``on_takeover`` accepts (see ``ExecutionPolicy``)."""


@dataclass(frozen=True, slots=True)
class Result:
    """What ``ExecutionPolicy.run`` (and ``Idempotency.run``) returns.

    ``replayed`` is true when ``value`` came from the store rather than from running the work;
    ``fence`` is the fence of the execution that produced it. ``takeover`` is true when this
    call ran the work after taking the key over from a holder whose lease lapsed without an
    outcome (the work may have run twice: ``previous_fence`` is that holder's fence).
    """

    value: bytes
    replayed: bool
    fence: int
    takeover: bool = False
    previous_fence: int | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """The recorded outcome of an earlier execution of the key: give it to the retry."""

    response: bytes
    fence: int
    record: Record


class ExecutionPolicy:
    """How a key is executed at most once over ``store``: the choices consumers differ in.

    Args:
        store: any ``IdempotencyStore``.
        lease_ttl: seconds an execution holds its key without a heartbeat; its
            ``LeaseKeeper`` extends the lease about every third of that.
        retention: seconds a recorded outcome is replayed.
        in_flight: ``"wait"`` for a running original (then replay it, or take the key over
            if it gave up) or ``"reject"`` with ``InProgressError`` at once.
        wait_timeout: seconds to wait for a running original (``None``: without limit);
            ``InProgressError`` after that.
        on_failure: what a failed execution does with its key: ``"release"`` it (a retry
            runs again), ``"hold"`` it until the lease lapses (never risk a second run in
            that window), or a callable given the ``Exception`` that returns the bytes to
            record as the outcome (errors replay too) or ``None`` to release. A cancellation
            is a failure: ``"release"`` and ``"hold"`` apply to it; a callable is not asked
            (nothing was produced to record) and the key is released.
        on_takeover: what to do on taking the key over from a holder whose lease lapsed
            without an outcome (it may have done the work, or not): ``"run"`` the work again
            (the ``Execution`` says ``takeover``), or ``"refuse"``: run nothing, record that
            the outcome is unknown and raise ``OutcomeUnknownError`` (to this caller and
            every retry, until the key is deleted or its retention ends).
        max_response_bytes: the largest outcome recorded (``None``: the store's own limit
            only). A larger one is handled like one the store refuses as too large: the
            key records its size instead, and retries get ``OutcomeTooLargeError``.
        consumer: the consumer's name in ``idemstore.consumer.calls`` and its span
            (``idemstore {consumer}``) once ``idemstore.instrument()`` was called.
    """

    __slots__ = (
        "consumer",
        "in_flight",
        "lease_ttl",
        "max_response_bytes",
        "on_failure",
        "on_takeover",
        "retention",
        "store",
        "wait_timeout",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        lease_ttl: float = 30.0,
        retention: float = 86400.0,
        in_flight: Literal["wait", "reject"] = "wait",
        wait_timeout: float | None = None,
        on_failure: FailurePolicy = "release",
        on_takeover: TakeoverPolicy = "run",
        max_response_bytes: int | None = None,
        consumer: str = "runner",
    ) -> None:
        if in_flight not in ("wait", "reject"):
            raise ConfigurationError(f"in_flight must be 'wait' or 'reject', not {in_flight!r}")
        if on_takeover not in ("run", "refuse"):
            raise ConfigurationError(f"on_takeover must be 'run' or 'refuse', not {on_takeover!r}")
        if max_response_bytes is not None and (
            isinstance(max_response_bytes, bool)
            or not isinstance(max_response_bytes, int)
            or max_response_bytes < 1
        ):
            raise ConfigurationError(
                f"max_response_bytes must be a positive int or None, not {max_response_bytes!r}"
            )
        if on_failure not in ("release", "hold") and not callable(on_failure):
            raise ConfigurationError(
                "on_failure must be 'release', 'hold' or a callable that encodes the error "
                f"as the recorded outcome, not {on_failure!r}"
            )
        self.store = store
        self.lease_ttl = check_duration("lease_ttl", lease_ttl)
        self.retention = check_duration("retention", retention)
        self.in_flight = in_flight
        self.wait_timeout = (
            None if wait_timeout is None else check_duration("wait_timeout", wait_timeout)
        )
        self.on_failure = on_failure
        self.on_takeover = on_takeover
        self.max_response_bytes = max_response_bytes
        # Names this consumer in idemstore.consumer.calls and its spans (instrument()).
        self.consumer = consumer

    async def begin(self, key: str, fingerprint: str, *, scope: str = "") -> Execution | Replay:
        """Own the key (an ``Execution``) or get its recorded outcome (a ``Replay``).

        Raises ``ConflictError``, ``InProgressError``, ``LeaseLostError`` (the lease lapsed
        before the reply granting it arrived: nothing ran, the key was given up),
        ``OutcomeUnknownError`` (a takeover under ``on_takeover="refuse"``, or a key that
        recorded one), ``OutcomeTooLargeError`` / ``UnrecordableResultError`` (the key's work
        ran but its result could not be recorded), or what the store raises.
        """
        observer = current_observer()
        if observer is None:
            return await self._begin(self.store, key, fingerprint, scope)
        # The calls of this call go to the observer's view; self.store stays the caller's.
        store = observer.store_view(self.store)
        call = observer.call(self.consumer, store, key, scope)
        try:
            with call.reserving():
                claim = await self._begin(store, key, fingerprint, scope)
        except BaseException as exc:
            call.refused(exc)
            raise
        if isinstance(claim, Replay):
            call.replayed(claim.fence)
        else:
            claim.observe(call.executing(claim.fence))
        return claim

    async def _begin(
        self, store: IdempotencyStore, key: str, fingerprint: str, scope: str
    ) -> Execution | Replay:
        loop = asyncio.get_running_loop()
        deadline = None if self.wait_timeout is None else loop.time() + self.wait_timeout
        while True:
            asked = loop.time()
            reserving = store.reserve(
                key, fingerprint, scope=scope, lease_ttl=self.lease_ttl, retention=self.retention
            )
            reservation = await reserve_cancel_safe(store, reserving)
            outcome = reservation.outcome
            if outcome is Outcome.ACQUIRED:
                # The lease runs from a moment after the request left, by the engine's clock;
                # so by ours (monotonic, no skew with the engine's) it cannot end before
                # asked + lease_ttl. Past that, a reply came too late to start the work on.
                left = asked + self.lease_ttl - loop.time()
                lease = reservation.lease
                assert lease is not None
                if left <= 0:
                    raise await shielded(give_up_late_lease(store, reservation, self.lease_ttl))
                if reservation.takeover or logger.isEnabledFor(logging.INFO):
                    _log_acquired(lease.key, lease.scope, lease.fence, reservation.takeover)
                if reservation.takeover and self.on_takeover == "refuse":
                    raise await shielded(record_outcome_unknown(store, lease))
                return Execution(self, lease, store=store, first_beat=left / 3, taken=reservation)
            record = reservation.record
            assert record is not None
            if outcome is Outcome.COMPLETED:
                # A marker (the work ran, its outcome could not be recorded) raises its error.
                response = replayed_response(record)
                return Replay(response, record.fence, record)
            if outcome is Outcome.MISMATCH:
                raise ConflictError(
                    f"idempotency key {key!r} was already used with different arguments",
                    key=key,
                    scope=scope,
                    record=record,
                )
            remaining = None if deadline is None else deadline - loop.time()
            if self.in_flight == "reject" or (remaining is not None and remaining <= 0):
                raise InProgressError(
                    f"idempotency key {key!r} is being processed by another request",
                    key=key,
                    scope=scope,
                    record=record,
                )
            # The store returns as soon as the holder finishes, gives up, or its lease lapses;
            # then reserve again decides (replay, takeover, or still busy).
            await store.wait(
                key, scope=scope, timeout=self.lease_ttl if remaining is None else remaining
            )

    async def run(
        self,
        key: str,
        fingerprint: str,
        work: Callable[[], Awaitable[bytes]],
        *,
        scope: str = "",
    ) -> Result:
        """Run ``work`` once for the key and record what it returns, or replay the record.

        Whatever ``work`` raises propagates after ``on_failure`` is applied. A plain ``def``
        function is refused with ``TypeError`` before anything is reserved. Work that turns
        out, once called, to return no awaitable, or an awaitable of something that is not
        bytes, ran but cannot be recorded: the key records that, and this call and every
        retry raise ``UnrecordableResultError`` (a ``TypeError``) rather than run it again.
        """
        refuse_plain_function(work)
        claim = await self.begin(key, fingerprint, scope=scope)
        if isinstance(claim, Replay):
            return Result(claim.response, replayed=True, fence=claim.fence)
        async with claim:
            with running(claim):
                pending = work()
                if not inspect.isawaitable(pending):
                    raise await claim.settle_unrecordable(
                        f"work returned {type(pending).__name__}, not an awaitable: pass an"
                        " `async def` function or a zero-argument callable returning an"
                        " awaitable (such as `lambda: charge(args)` with an async charge)"
                    )
                value = await pending
            if not isinstance(value, bytes | bytearray | memoryview):
                raise await claim.settle_unrecordable(
                    f"work must return bytes, not {type(value).__name__}"
                )
            value = bytes(value)
            if not claim.finished:  # the work may have settled in its own transaction
                await claim.settle(value)
        return Result(
            value,
            replayed=False,
            fence=claim.fence,
            takeover=claim.takeover,
            previous_fence=claim.previous_fence,
        )


def _log_acquired(key: str, scope: str, fence: int, takeover: bool) -> None:
    """One structured line per acquisition: INFO when a key is reserved (fence 1: created),
    WARNING when a lapsed lease was taken over (its owner stopped heartbeating)."""
    extra = {"idemstore_key": key, "idemstore_scope": scope, "idemstore_fence": fence}
    if takeover:
        logger.warning(
            "idempotency key taken over from a lapsed lease: key %r scope %r fence %d",
            key,
            scope,
            fence,
            extra={**extra, "idemstore_takeover": True},
        )
    else:
        logger.info(
            "idempotency key reserved: key %r scope %r fence %d",
            key,
            scope,
            fence,
            extra={**extra, "idemstore_takeover": False},
        )
