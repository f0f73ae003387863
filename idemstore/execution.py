"""The one execution path every consumer takes: begin, then replay or execute and settle.

Every consumer of idemstore (the ``Idempotency`` runner, the ASGI middleware, the MCP proxy
and the MCP server adapters) runs a keyed piece of work through this module and nothing else
touches ``reserve`` / ``wait`` / ``extend`` / ``complete`` / ``release`` for it::

    policy = ExecutionPolicy(store, in_flight="reject")
    claim = await policy.begin(key, fingerprint, scope=scope)  # ConflictError, InProgressError
    if isinstance(claim, Replay):
        return claim.response                    # the recorded outcome
    async with claim:                            # an Execution: this caller owns the key
        response = await do_the_work()
        await claim.settle(response)             # recorded; retries replay it from now on

Public API (what callers may rely on):

``ExecutionPolicy(store, *, lease_ttl=30, retention=86400, in_flight="wait",
wait_timeout=None, on_failure="release", on_takeover="run", max_response_bytes=None)``
    The choices that differ between consumers; each is described on the class.

``await policy.begin(key, fingerprint, *, scope="") -> Execution | Replay``
    Reserve the key: a ``Replay`` of the recorded outcome, or an ``Execution`` this caller
    owns (its lease is kept alive from this moment). Raises ``ConflictError`` (other
    fingerprint), ``InProgressError`` (held by another caller and the policy is not to wait,
    or the wait timed out), ``LeaseLostError`` (the store's reply granting the lease came
    after the lease could have lapsed, by this process's monotonic clock: nothing started,
    the key was released), ``OutcomeUnknownError`` (a takeover under ``"refuse"``: nothing
    runs, and the key records that its outcome is unknown, so retries get this error too),
    the error of a key whose work ran but left no recordable outcome (``OutcomeTooLargeError``,
    ``UnrecordableResultError``: never a second run), or the store's error. Cancel-safe: a
    ``reserve`` that completes after the caller was cancelled is released before the
    cancellation propagates (so the cancellation takes as long as that reserve, which the
    store's timeouts bound; a second cancellation stops waiting for it, and the release still
    happens), and no lease is left that nobody owns. An ``Execution`` keeps its key alive
    until it is settled, released or failed: enter its ``async with`` block (or hand it to
    whoever settles it) right away.

``await policy.run(key, fingerprint, work, *, scope="") -> Result``
    ``begin`` plus the simplest execution: ``work()`` returns an awaitable of the bytes to
    record, run with ``current_execution()`` set. A plain ``def`` is refused before
    reserving; work that returns no awaitable or no bytes ran, so the key records that and
    this call and its retries raise ``UnrecordableResultError`` (a ``TypeError``).

``Execution``: one owned execution of the work (a lease, kept alive by a ``LeaseKeeper``).
    It is not bound to the task that began it: a consumer may stop waiting for the work (a
    client cancelled, the answer comes on another stream) and settle it later from any task;
    the lease stays alive until then (detaching is simply keeping the object).

    - ``await settle(response) -> bool``: record ``response`` as the outcome, now, even while
      the work goes on (early settlement: an HTTP response is final when its last body
      message is sent, background tasks may still run). ``True`` when stored; ``False`` when
      the lease was lost to a takeover or the response is too large (then the key records
      its size, and retries get ``OutcomeTooLargeError``). Store errors propagate. Shielded:
      a cancellation of the caller cannot cut it short (the cancellation still propagates).
      ``settle(response, connection=conn)``: inside ``conn``'s open transaction, on a SQL
      store of the same database; ``LeaseLostError`` if fenced out (see ``idemstore.settling``).
    - ``await settle_unrecordable(why) -> UnrecordableResultError``: the work ran but its
      result cannot be recorded; record that instead and return the error to raise.
    - ``await release()``: give the key up without recording (a retry runs again). Quiet:
      a store error is logged, not raised. Shielded.
    - ``await fail(error)``: apply the policy's ``on_failure`` to ``error``. Shielded, and
      quiet like ``release`` (a store error while recording the error is logged).
    - ``async with execution:`` exiting with an exception (a cancellation included) applies
      ``fail``; exiting normally without settling releases the key (nothing recorded). Once
      settled (or released), later exceptions are the consumer's, not the request's: they
      propagate but change nothing in the store.
    - ``settled``, ``finished`` (settled, released or held), ``lease`` (the latest),
      ``fence``, ``key``, ``scope``, ``lapsed`` (a heartbeat found the lease lapsed),
      ``takeover`` and ``previous_fence`` (the holder taken over from, or ``None``);
      ``await checkpoint(name, data)`` and ``checkpoints``: ``idemstore.recovery_points``.

``Replay``: ``response`` (the recorded bytes), ``fence``, ``record``.

``Result``: what ``run`` returns: ``value``, ``replayed``, ``fence``, ``takeover``,
``previous_fence``.

``current_execution()``: the ``Execution`` whose work runs in this context, or ``None``.

``LeaseKeeper``: the heartbeat, for a consumer that holds a lease of its own (see
``idemstore.lease_keeping``). Markers: ``idemstore.outcome_markers``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from idemstore import outcome_markers, settling
from idemstore.errors import (
    ConfigurationError,
    ConflictError,
    InProgressError,
    ResponseTooLargeError,
    UnrecordableResultError,
)
from idemstore.execution_hooks import current_observer
from idemstore.lease_keeping import (
    LeaseKeeper,
    give_up_late_lease,
    release_quietly,
    reserve_cancel_safe,
    shielded,
)
from idemstore.protocol import AsyncContext, Outcome, answers_inline
from idemstore.records import check_duration, check_response
from idemstore.recovery_points import RecoveryPoints
from idemstore.running_work import current_execution, refuse_plain_function, running

if TYPE_CHECKING:
    from collections.abc import Awaitable, Coroutine

    from idemstore.execution_hooks import ExecutionObservation, FinishedState
    from idemstore.protocol import Checkpoint, IdempotencyStore, Lease, Record, Reservation

__all__ = [
    "Execution",
    "ExecutionPolicy",
    "FailurePolicy",
    "LeaseKeeper",
    "Replay",
    "Result",
    "TakeoverPolicy",
    "current_execution",
]

logger = logging.getLogger("idemstore.execution")

T = TypeVar("T")

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
            claim._observation = call.executing(claim.fence)
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
                if reservation.takeover and self.on_takeover == "refuse":
                    raise await shielded(outcome_markers.record_outcome_unknown(store, lease))
                return Execution(self, lease, store=store, first_beat=left / 3, taken=reservation)
            record = reservation.record
            assert record is not None
            if outcome is Outcome.COMPLETED:
                # A marker (the work ran, its outcome could not be recorded) raises its error.
                response = outcome_markers.replayed_response(record)
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


_State = Literal["running", "settling", "committing", "settled", "released", "held"]


class Execution(AsyncContext):
    """One owned execution of a key, from ``ExecutionPolicy.begin`` to its settlement.

    While it is unfinished a ``LeaseKeeper`` keeps the key's lease alive, whatever task
    holds the object: a consumer may stop waiting for the work and settle later from another
    task (detaching), or settle early while the work goes on. Exactly one of ``settle``,
    ``release`` or ``fail`` finishes it (a second call raises ``RuntimeError``), and as an
    async context manager it applies ``fail`` to an exception (a cancellation included) that
    leaves the block unsettled, and ``release`` to a block left normally without a
    settlement. Exceptions after settlement propagate but change nothing in the store.

    ``takeover`` is true when the key was taken over from a holder whose lease lapsed without
    an outcome (that holder may have done the work: ``previous_fence`` is its fence, ``None``
    on a first execution).
    """

    __slots__ = (
        "_keeper",
        "_observation",
        "_policy",
        "_recovery",
        "_state",
        "_store",
        "fence",
        "key",
        "previous_fence",
        "scope",
        "takeover",
    )

    def __init__(
        self,
        policy: ExecutionPolicy,
        lease: Lease,
        *,
        store: IdempotencyStore,
        first_beat: float | None = None,
        taken: Reservation | None = None,
    ) -> None:
        self._policy = policy
        self._store = store  # the one begin reserved on: the policy's, or an observer's view
        self._keeper = LeaseKeeper(self._store, lease, policy.lease_ttl, first_beat=first_beat)
        self._state: _State = "running"
        self.key = lease.key
        self.scope = lease.scope
        self.fence = lease.fence
        self.takeover = takeover = taken is not None and taken.takeover
        self._recovery = RecoveryPoints(store, taken.checkpoints if taken else ())
        # A takeover raises the fence by one (the store contract).
        self.previous_fence = lease.fence - 1 if takeover else None
        # Set by begin when an observer is registered (idemstore.instrument()).
        self._observation: ExecutionObservation | None = None

    def __repr__(self) -> str:
        return f"<Execution key={self.key!r} scope={self.scope!r} fence={self.fence} {self._state}>"

    @property
    def lease(self) -> Lease:
        """The latest lease (heartbeats replace it with an extended one)."""
        return self._keeper.lease

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """Recovery points of the key so far, oldest first (``idemstore.recovery_points``)."""
        return self._recovery.recorded

    async def checkpoint(self, name: str, data: bytes = b"", *, connection: object = None) -> None:
        """Record a finished step, fenced: ``LeaseLostError`` if the key was taken over."""
        await self._recovery.record(
            self.lease, name, data, finished=self.finished, connection=connection
        )

    @property
    def lapsed(self) -> bool:
        """Whether a heartbeat found the lease lapsed (``settle`` may still succeed)."""
        return self._keeper.lapsed

    @property
    def settled(self) -> bool:
        """Whether an outcome was recorded (or its recording has started)."""
        return self._state in ("settling", "settled")

    @property
    def finished(self) -> bool:
        """Whether the key is no longer kept alive: settled, released or held."""
        return self._state != "running"

    def _claim(self, state: _State) -> None:
        if self._state != "running":
            raise RuntimeError(f"execution of key {self.key!r} is already {self._state}")
        # Synchronously, before any await: a cancellation that lands in what follows must
        # find the execution finished, not apply the failure policy on top of it.
        self._state = state

    async def settle(self, response: bytes, *, connection: object = None) -> bool:
        """Record ``response`` as the outcome now; retries replay it from then on.

        Returns ``True`` when stored, ``False`` when the lease was lost to a takeover (logged)
        or the response is too large for the store or the policy's ``max_response_bytes``
        (logged; the key records the size instead, and retries get ``OutcomeTooLargeError``
        rather than run the work again). Store errors propagate. A cancellation of the
        caller cannot cut it short. With ``connection`` (asyncpg or aiosqlite, to the store's
        database, transaction open) it commits with the caller's transaction, raises
        ``LeaseLostError`` when fenced out (roll back), and is ``settled`` once the block ends.
        """
        if connection is not None:
            return await settling.settle_within(self, response, connection)
        response = check_response(response)
        self._claim("settling")
        return await self._bookkeeping("settled", self._settle(response))

    async def settle_unrecordable(self, why: str) -> UnrecordableResultError:
        """The work ran but its result cannot be recorded (``why`` says what and why):
        record that in its place, so that retries get ``UnrecordableResultError`` rather than
        a second run. Returns that error for this caller to raise
        (``raise await execution.settle_unrecordable(...)``). Finishes the execution like
        ``settle``; quiet like ``release`` (a store error is logged, and the key stays held
        until its lease lapses)."""
        self._claim("settling")
        logger.warning("result of key %r cannot be recorded: %s", self.key, why)
        try:
            await self._bookkeeping(
                "settled", self._settle(outcome_markers.unrecordable(why), is_marker=True)
            )
        except Exception:
            logger.warning("could not record that key %r is unrecordable", self.key, exc_info=True)
        return outcome_markers.unrecordable_error(self.key, self.scope, self.fence, why)

    async def _settle(self, response: bytes, *, is_marker: bool = False) -> bool:
        """Record ``response``: escaped, so no response is taken for a marker, unless it is
        ``is_marker`` (one this module made)."""
        lease = await self._keeper.stop()
        store = self._store
        limit = self._policy.max_response_bytes
        try:
            if limit is not None and len(response) > limit and not is_marker:
                raise ResponseTooLargeError(
                    f"the response is {len(response)} bytes; max_response_bytes is {limit}",
                    size=len(response),
                    limit=limit,
                )
            recorded = response if is_marker else outcome_markers.escape(response)
            stored = await store.complete(lease, recorded)
        except ResponseTooLargeError as exc:
            if is_marker:
                raise
            await outcome_markers.record_too_large(store, lease, len(response), exc)
            return False
        finally:
            self._state = "settled"
        if not stored:
            logger.warning(
                "lease on key %r (scope %r, fence %d) was lost while the work ran; "
                "its result was returned but not stored",
                lease.key,
                lease.scope,
                lease.fence,
            )
        return stored

    async def release(self) -> None:
        """Give the key up without recording anything: a retry runs again.

        Quiet (a store error is logged: the key then frees itself when the lease lapses) and
        not cut short by a cancellation of the caller.
        """
        self._claim("released")
        await self._bookkeeping("released", self._release())

    async def _release(self) -> None:
        lease = await self._keeper.stop()
        await release_quietly(self._store, lease)

    async def fail(self, error: BaseException) -> None:
        """Apply the policy's ``on_failure`` to ``error``; quiet like ``release``."""
        policy = self._policy.on_failure
        if policy == "hold":
            self._claim("held")
            await self._bookkeeping("held", self._keeper.stop())
            logger.info("key %r is held until its lease lapses after a failure", self.key)
            return
        if callable(policy) and isinstance(error, Exception):
            # The encoder runs before the state changes: if it raises (or returns something
            # that is not bytes), the key is released.
            encoded: bytes | None = None
            try:
                returned = policy(error)
                encoded = None if returned is None else check_response(returned)
            except Exception:
                logger.exception("on_failure could not encode the error of key %r", self.key)
            if encoded is not None:
                try:
                    await self.settle(encoded)
                except Exception:
                    # The work's own error is what its caller must see; the key stays held
                    # until the lease lapses.
                    logger.warning("could not record the error of key %r", self.key, exc_info=True)
                return
        await self.release()

    def _bookkeeping(
        self, state: FinishedState, bookkeeping: Coroutine[Any, Any, T]
    ) -> Awaitable[T]:
        """``bookkeeping`` (as the registered observer observes it), run to its end whatever
        happens to the caller."""
        if self._observation is not None:
            bookkeeping = self._observation.finishing(state, bookkeeping)
        if self._keeper.idle and answers_inline(self._store):
            # Stopping the heartbeat and the store's call both finish without suspending:
            # nothing can cut them short, so no task is needed to protect them.
            return bookkeeping
        return shielded(bookkeeping)

    async def _leave(self, exc: BaseException | None) -> None:
        if self._state == "committing":
            return await settling.leave_committing(self, exc)
        if self.finished:
            return
        if exc is not None:
            await self.fail(exc)
        else:
            await self.release()
