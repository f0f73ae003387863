"""``Execution``: one owned execution of a key, and the one owner of its state.

The states: ``running`` (the key is owned, its lease kept alive), then exactly one of
``settling`` → ``settled`` (an outcome recorded), ``committing`` (an outcome written in the
caller's open transaction, ``idemstore.execution.settling``) → ``settled`` or back to
``running`` when that transaction failed, ``released`` (given up, or fenced out) or ``held``
(kept until the lease lapses). Only this module changes the state; the helpers of the execution
path (settling, recovery points) and the consumers use the named transitions and properties
below, never the fields.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from idemstore.errors import (
    OutcomeTooLargeError,
    ResponseTooLargeError,
    UnrecordableResultError,
)
from idemstore.execution import outcome_markers, settling
from idemstore.execution.lease_keeping import LeaseKeeper, release_quietly, shielded
from idemstore.execution.recovery_points import RecoveryPoints
from idemstore.protocol import AsyncContext, Status, answers_inline
from idemstore.records import check_response

if TYPE_CHECKING:
    from collections.abc import Awaitable, Coroutine

    from idemstore.execution.hooks import ExecutionObservation, FinishedState
    from idemstore.execution.policy import ExecutionPolicy
    from idemstore.protocol import Checkpoint, IdempotencyStore, Lease, Reservation

__all__ = ["Execution"]

logger = logging.getLogger("idemstore.execution")

T = TypeVar("T")


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
    def policy(self) -> ExecutionPolicy:
        """The policy that began this execution (its ``on_failure``, limits and retention)."""
        return self._policy

    def observe(self, observation: ExecutionObservation | None) -> None:
        """Report how this execution finishes to ``observation`` (``begin`` does this when an
        observer is registered: ``idemstore.instrument()``)."""
        self._observation = observation

    @property
    def lease(self) -> Lease:
        """The latest lease (heartbeats replace it with an extended one)."""
        return self._keeper.lease

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """Recovery points of the key so far, oldest first
        (``idemstore.execution.recovery_points``)."""
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

    def check_running(self) -> None:
        """``RuntimeError`` (saying what it is instead) unless the execution is ``running``."""
        if self._state != "running":
            raise RuntimeError(f"execution of key {self.key!r} is already {self._state}")

    async def start_committing(self) -> Lease:
        """``running`` → ``committing``: the outcome is about to be written inside the caller's
        transaction. Stops the heartbeat (the completed row needs none) and returns the lease
        to fence that write with. ``RuntimeError`` unless running."""
        self._claim("committing")
        return await self._keeper.stop()

    async def fenced_out(self) -> None:
        """``committing`` → ``released``: the caller's fenced write found the key taken over.
        The execution is over, unsettled: the key is another owner's."""
        if self._state != "committing":
            raise RuntimeError(f"execution of key {self.key!r} is {self._state}, not committing")
        self._state = "released"
        if self._observation is not None:
            await self._observation.finishing("released", _finished(False))

    def _claim(self, state: _State) -> None:
        self.check_running()
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

    async def settle_too_large(self, size: int, limit: int) -> OutcomeTooLargeError:
        """The work ran and produced a result of ``size`` bytes, over the door's ``limit``, that
        was handed to its caller but not kept (a streamed response): record its size in its
        place, so that retries get ``OutcomeTooLargeError`` rather than a second run. Returns
        that error. Finishes the execution like ``settle``; quiet like ``release``."""
        self._claim("settling")
        why = f"the response was {size} bytes; the recording limit is {limit}"
        logger.warning("result of key %r cannot be recorded: %s", self.key, why)
        try:
            marker = outcome_markers.too_large(size, limit, why)
            await self._bookkeeping("settled", self._settle(marker, is_marker=True))
        except Exception:
            logger.warning("could not record that key %r was too large", self.key, exc_info=True)
        return outcome_markers.too_large_error(self.key, self.scope, self.fence, size, limit, why)

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
        not cut short by a cancellation of the caller. Allowed while *committing* too (after
        ``settle(connection=...)``, outside the ``async with`` block): the release is fenced,
        so it gives the key up if the caller's transaction rolled the outcome back and leaves
        a committed outcome untouched.
        """
        if self._state == "committing":
            self._state = "released"
        else:
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
            return await self._leave_committing(exc)
        if self.finished:
            return
        if exc is not None:
            await self.fail(exc)
        else:
            await self.release()

    async def _leave_committing(self, exc: BaseException | None) -> None:
        """The end of the ``async with`` block of an execution settled through a connection."""
        if exc is None:
            if not await self._outcome_committed():
                # The completion was rolled back (a savepoint, or a rollback swallowed inside
                # the block) while the block ended normally: nothing is recorded and the work's
                # effects are the caller's to know. Not settled: the key is held until the
                # stopped lease lapses, and a retry then is a takeover (``on_takeover``).
                logger.warning(
                    "settle(connection=...) of key %r did not commit: its transaction or"
                    " savepoint was rolled back while the block ended normally. Nothing was"
                    " recorded; the key is held until its lease lapses. Settle in the"
                    " outermost transaction and let a rollback leave the block with an error",
                    self.key,
                )
                self._state = "held"
                if self._observation is not None:
                    await self._observation.finishing("held", _finished(False))
                return
            # The caller committed: nothing more to write. An observer sees the settlement now
            # that it is final (a failure is observed as whatever the policy does instead).
            self._state = "settled"
            if self._observation is not None:
                await self._observation.finishing("settled", _finished(True))
            return
        # The caller's transaction rolled back, or something failed after it committed: the
        # policy applies as to any failure, and its fenced calls find a completed record
        # untouchable.
        self._state = "running"
        await self.fail(exc)

    async def _outcome_committed(self) -> bool:
        """Whether the completion written in the caller's transaction is in the store (one
        read; a store error counts as committed, as before this check)."""
        try:
            record = await self._store.get(self.key, scope=self.scope)
        except Exception:
            logger.warning("could not confirm the outcome of key %r", self.key, exc_info=True)
            return True
        return (
            record is not None
            and record.status is Status.COMPLETED
            and (record.fence == self.fence)
        )


async def _finished(stored: bool) -> bool:
    return stored
