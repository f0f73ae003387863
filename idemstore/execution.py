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
wait_timeout=None, on_failure="release")``
    The choices that differ between consumers. ``in_flight``: ``"wait"`` for a running
    original (up to ``wait_timeout`` seconds, ``None``: without limit) or ``"reject"`` at once.
    ``on_failure``: ``"release"`` the key (a retry runs again), ``"hold"`` it until the lease
    lapses (never risk a second run in that window), or a callable ``(error) -> bytes | None``
    that records what it returns as the outcome (SEP-3182: errors replay too; ``None``
    releases). The callable is only given ``Exception``\\ s: a cancellation or another
    ``BaseException`` releases under that policy, since no outcome was produced.

``await policy.begin(key, fingerprint, *, scope="") -> Execution | Replay``
    Reserve the key: a ``Replay`` of the recorded outcome, or an ``Execution`` this caller
    owns (its lease is kept alive from this moment). Raises ``ConflictError`` (other
    fingerprint), ``InProgressError`` (held by another caller and the policy is not to wait,
    or the wait timed out), or the store's error. Cancel-safe: a ``reserve`` that completes
    after the caller was cancelled is released before the cancellation propagates (so the
    cancellation takes as long as that reserve, which the store's timeouts bound; a second
    cancellation stops waiting for it, and the release still happens), and no lease is left
    that nobody owns. An ``Execution`` keeps its key alive until it is settled, released or
    failed: enter its ``async with`` block (or hand it to whoever settles it) right away.

``await policy.run(key, fingerprint, work, *, scope="") -> Result``
    ``begin`` plus the simplest execution: ``work()`` returns the bytes to record.

``Execution``: one owned execution of the work (a lease, kept alive by a ``LeaseKeeper``).
    It is not bound to the task that began it: a consumer may stop waiting for the work (a
    client cancelled, the answer comes on another stream) and settle it later from any task;
    the lease stays alive until then (detaching is simply keeping the object).

    - ``await settle(response) -> bool``: record ``response`` as the outcome, now, even while
      the work goes on (early settlement: an HTTP response is final when its last body
      message is sent, background tasks may still run). ``True`` when stored; ``False`` when
      the lease was lost to a takeover or the response is too large for the store (then the
      key is released). Store errors propagate. Shielded: a cancellation of the caller
      cannot cut it short (the cancellation still propagates).
    - ``await release()``: give the key up without recording (a retry runs again). Quiet:
      a store error is logged, not raised. Shielded.
    - ``await fail(error)``: apply the policy's ``on_failure`` to ``error``. Shielded, and
      quiet like ``release`` (a store error while recording the error is logged).
    - ``async with execution:`` exiting with an exception (a cancellation included) applies
      ``fail``; exiting normally without settling releases the key (nothing recorded). Once
      settled (or released), later exceptions are the consumer's, not the request's: they
      propagate but change nothing in the store.
    - ``settled`` (an outcome was recorded or its recording started), ``finished`` (settled,
      released or held: the key is no longer kept alive), ``lease`` (the latest lease),
      ``fence``, ``key``, ``scope``, ``lapsed`` (a heartbeat found the lease lapsed).

``Replay``: ``response`` (the recorded bytes), ``fence``, ``record``.

``Result``: what ``run`` returns: ``value``, ``replayed``, ``fence``.

``LeaseKeeper``: the heartbeat, for a consumer that holds a lease of its own (see
``idemstore.lease_keeping``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self, TypeAlias, TypeVar

from idemstore import telemetry
from idemstore.errors import (
    ConfigurationError,
    ConflictError,
    InProgressError,
    ResponseTooLargeError,
)
from idemstore.lease_keeping import LeaseKeeper, release_quietly, reserve_cancel_safe, shielded
from idemstore.protocol import Outcome, answers_inline
from idemstore.records import check_duration, check_response

if TYPE_CHECKING:
    from collections.abc import Awaitable, Coroutine
    from types import TracebackType

    from idemstore.protocol import IdempotencyStore, Lease, Record, Reservation
    from idemstore.telemetry.consumer import ExecutionObserver

__all__ = [
    "Execution",
    "ExecutionPolicy",
    "FailurePolicy",
    "LeaseKeeper",
    "Replay",
    "Result",
]

logger = logging.getLogger("idemstore.execution")

T = TypeVar("T")

FailurePolicy: TypeAlias = Literal["release", "hold"] | Callable[[Exception], bytes | None]
"""What ``on_failure`` accepts (see ``ExecutionPolicy``)."""


@dataclass(frozen=True, slots=True)
class Result:
    """What ``ExecutionPolicy.run`` (and ``Idempotency.run``) returns.

    ``replayed`` is true when ``value`` came from the store rather than from running the work;
    ``fence`` is the fence of the execution that produced it.
    """

    value: bytes
    replayed: bool
    fence: int


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
        consumer: the consumer's name in ``idemstore.consumer.calls`` and its span
            (``idemstore {consumer}``) once ``idemstore.instrument()`` was called.
    """

    __slots__ = (
        "consumer",
        "in_flight",
        "lease_ttl",
        "on_failure",
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
        consumer: str = "runner",
    ) -> None:
        if in_flight not in ("wait", "reject"):
            raise ConfigurationError(f"in_flight must be 'wait' or 'reject', not {in_flight!r}")
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
        # Names this consumer in idemstore.consumer.calls and its spans (instrument()).
        self.consumer = consumer

    async def begin(self, key: str, fingerprint: str, *, scope: str = "") -> Execution | Replay:
        """Own the key (an ``Execution``) or get its recorded outcome (a ``Replay``).

        Raises ``ConflictError``, ``InProgressError``, or what the store raises.
        """
        instruments = telemetry.current()
        if instruments is None:
            return await self._begin(key, fingerprint, scope)
        return await instruments.observe_begin(
            self, lambda: self._begin(key, fingerprint, scope), key, scope
        )

    async def _begin(self, key: str, fingerprint: str, scope: str) -> Execution | Replay:
        loop = asyncio.get_running_loop()
        deadline = None if self.wait_timeout is None else loop.time() + self.wait_timeout
        while True:
            reservation = await self._reserve(key, fingerprint, scope)
            outcome = reservation.outcome
            if outcome is Outcome.ACQUIRED:
                assert reservation.lease is not None
                return Execution(self, reservation.lease)
            record = reservation.record
            assert record is not None
            if outcome is Outcome.COMPLETED:
                assert record.response is not None
                return Replay(record.response, record.fence, record)
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
            await self.store.wait(
                key, scope=scope, timeout=self.lease_ttl if remaining is None else remaining
            )

    async def _reserve(self, key: str, fingerprint: str, scope: str) -> Reservation:
        reserving = self.store.reserve(
            key, fingerprint, scope=scope, lease_ttl=self.lease_ttl, retention=self.retention
        )
        return await reserve_cancel_safe(self.store, reserving)

    async def run(
        self,
        key: str,
        fingerprint: str,
        work: Callable[[], Awaitable[bytes]],
        *,
        scope: str = "",
    ) -> Result:
        """Run ``work`` once for the key and record what it returns, or replay the record.

        Whatever ``work`` raises propagates after ``on_failure`` is applied; a result that is
        not bytes is a ``TypeError`` (a failure like any other).
        """
        claim = await self.begin(key, fingerprint, scope=scope)
        if isinstance(claim, Replay):
            return Result(claim.response, replayed=True, fence=claim.fence)
        async with claim:
            value = await work()
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"work must return bytes, not {type(value).__name__}")
            value = bytes(value)
            await claim.settle(value)
        return Result(value, replayed=False, fence=claim.fence)


_State = Literal["running", "settling", "settled", "released", "held"]


class Execution:
    """One owned execution of a key, from ``ExecutionPolicy.begin`` to its settlement.

    While it is unfinished a ``LeaseKeeper`` keeps the key's lease alive, whatever task
    holds the object: a consumer may stop waiting for the work and settle later from another
    task (detaching), or settle early while the work goes on. Exactly one of ``settle``,
    ``release`` or ``fail`` finishes it (a second call raises ``RuntimeError``), and as an
    async context manager it applies ``fail`` to an exception (a cancellation included) that
    leaves the block unsettled, and ``release`` to a block left normally without a
    settlement. Exceptions after settlement propagate but change nothing in the store.
    """

    __slots__ = ("_keeper", "_policy", "_state", "fence", "key", "observer", "scope")

    def __init__(self, policy: ExecutionPolicy, lease: Lease) -> None:
        self._policy = policy
        self._keeper = LeaseKeeper(policy.store, lease, policy.lease_ttl)
        self._state: _State = "running"
        self.key = lease.key
        self.scope = lease.scope
        self.fence = lease.fence
        # Set by idemstore.telemetry after instrument(): the consumer span, ended on finishing.
        self.observer: ExecutionObserver | None = None

    def __repr__(self) -> str:
        return f"<Execution key={self.key!r} scope={self.scope!r} fence={self.fence} {self._state}>"

    @property
    def lease(self) -> Lease:
        """The latest lease (heartbeats replace it with an extended one)."""
        return self._keeper.lease

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

    async def settle(self, response: bytes) -> bool:
        """Record ``response`` as the outcome now; retries replay it from then on.

        Returns ``True`` when stored, ``False`` when the lease was lost to a takeover (logged)
        or the response is too large for the store (logged; the key is released). Store
        errors propagate. A cancellation of the caller cannot cut it short.
        """
        response = check_response(response)
        self._claim("settling")
        return await self._bookkeeping("settled", self._settle(response))

    async def _settle(self, response: bytes) -> bool:
        lease = await self._keeper.stop()
        try:
            stored = await self._policy.store.complete(lease, response)
        except ResponseTooLargeError:
            # The work ran and its caller gets the value; a key left locked would only turn
            # every retry into a wait for the lease to lapse, so give it up at once.
            logger.warning(
                "result for key %r is too large for the store; returned but not recorded",
                lease.key,
            )
            await release_quietly(self._policy.store, lease)
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
        await release_quietly(self._policy.store, lease)

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

    def _bookkeeping(self, state: str, bookkeeping: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``bookkeeping`` (under the consumer span after instrument()), run to its end
        whatever happens to the caller."""
        if self.observer is not None:
            bookkeeping = self.observer.finishing(state, bookkeeping)
        if self._keeper.idle and answers_inline(self._policy.store):
            # Stopping the heartbeat and the store's call both finish without suspending:
            # nothing can cut them short, so no task is needed to protect them.
            return bookkeeping
        return shielded(bookkeeping)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.finished:
            return
        if exc is not None:
            await self.fail(exc)
        else:
            await self.release()
