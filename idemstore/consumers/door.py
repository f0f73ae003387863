"""The consumer door: one message delivery in, at most one run of its handler per key.

A broker delivers at least once: a consumer that dies before its ack, a visibility timeout
that runs out, a producer that sends one business event twice. ``ConsumerDoor.handle`` takes
one delivery (an adapter's ``Delivery``: SQS, Redis Streams, RabbitMQ, NATS JetStream) and
runs the handler on the shared execution path (``ExecutionPolicy``), then tells the broker
what became of the message:

========================= ========================================= ========================
what the key says         what the door does                        ``Disposition``
========================= ========================================= ========================
new (or released)         run the handler, record, then ack         ``PROCESSED``
recorded                  ack without running (``on_duplicate``)    ``REPLAYED``
held by another consumer  not acked: back after ``busy_delay``      ``BUSY``
handler raised            ``on_failure`` applied, back after        ``FAILED``
                          ``failure_delay`` (so the broker's
                          redelivery count and DLQ apply)
fenced out (the lease     not acked, not released: the message is   ``FENCED_OUT``
lapsed and another took   the new holder's (``Delivery.leave``)
it over meanwhile)
conflict, outcome         dead-lettered: no retry can succeed       ``DEAD_LETTERED``
unknown, no usable key
ran, result unrecordable  acked (it ran once; nothing to replay)    ``UNRECORDED``
store unreachable         not acked: back after ``busy_delay``      ``BUSY``
========================= ========================================= ========================

The ack comes only after the outcome is recorded; a crash between the two redelivers the
message, which then replays. While the handler runs, the message's own broker deadline
(SQS visibility, JetStream ``AckWait``, a stream entry's idle time) is pushed out at the
lease heartbeat's cadence, by the lease's length, and no longer once the heartbeat found the
lease lost: so a long handler is neither redelivered nor taken over, and one that outlives
both (a paused process) is fenced out when it wakes, never recorded twice.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Any, Protocol

from idemstore import ExecutionPolicy, current_execution
from idemstore.backends.startup import check_at_startup
from idemstore.consumers.messages import UNKEYABLE, MessageKeying, message_id
from idemstore.execution.refusals import Refusal, refusal_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from idemstore import Execution, Idempotency, Serializer
    from idemstore.consumers.messages import Message

__all__ = [
    "RETRY_DELAY",
    "ConsumerDoor",
    "Delivery",
    "Disposition",
    "Polling",
    "handle_all",
    "logger",
]

logger = logging.getLogger("idemstore.consumers")

# Seconds a consumer's loop waits after its broker failed a receive, before the next.
RETRY_DELAY = 1.0


class Delivery(Protocol):
    """One delivery of a message, as an adapter hands it to the door.

    A Kafka adapter, say, is one small module with a class like this one (``ack`` commits
    the offset, ``keep`` does nothing: a partition is held by its consumer, not by a
    timeout).
    """

    @property
    def message(self) -> Message: ...

    async def ack(self) -> None:
        """The message is done: the broker must never deliver it again."""

    async def retry_later(self, delay: float) -> None:
        """Not done: deliver it again after about ``delay`` seconds (a nack with a delay, a
        visibility timeout set to ``delay``, or the entry left pending)."""

    async def keep(self, seconds: float) -> None:
        """Still being worked on: do not redeliver it for ``seconds`` more."""

    async def leave(self) -> None:
        """Another consumer took the message's key over: do nothing that would take the
        message from it (an ack would); let the broker's own timeout decide."""

    async def dead_letter(self) -> None:
        """No retry can succeed: reject it towards the broker's dead-letter queue (or, where
        the broker has no reject, let its redelivery limit move it there)."""


class Disposition(enum.StrEnum):
    """What ``ConsumerDoor.handle`` did with a delivery (see the module's table)."""

    PROCESSED = "processed"
    REPLAYED = "replayed"
    BUSY = "busy"
    FAILED = "failed"
    FENCED_OUT = "fenced_out"
    DEAD_LETTERED = "dead_lettered"
    UNRECORDED = "unrecorded"
    ERROR = "error"
    """The broker (an ack, a nack) or ``on_duplicate`` raised; logged. Whatever was not
    acked comes back after the broker's own timeout (``handle_all`` only)."""


async def handle_all(
    door: ConsumerDoor,
    deliveries: Iterable[Delivery],
    handler: Callable[[Message], Awaitable[Any]],
) -> list[Disposition]:
    """``door.handle`` on every delivery at once; an error of one (a broker call that
    failed) is logged as ``ERROR`` and does not stop the others or the consumer's loop."""
    await door.check_store()
    pending = list(deliveries)
    outcomes = await asyncio.gather(
        *(door.handle(d, handler) for d in pending), return_exceptions=True
    )
    handled: list[Disposition] = []
    for delivery, outcome in zip(pending, outcomes, strict=True):
        if isinstance(outcome, Disposition):
            handled.append(outcome)
        elif isinstance(outcome, Exception):
            logger.error("message %r: %s", delivery.message.id, outcome, exc_info=outcome)
            handled.append(Disposition.ERROR)
        else:
            raise outcome  # a cancellation (or a KeyboardInterrupt) ends the consumer
    return handled


_DEAD_LETTER = frozenset({Refusal.CONFLICT, Refusal.OUTCOME_UNKNOWN, Refusal.INVALID_KEY})


class ConsumerDoor:
    """Handle message deliveries so that each key's handler runs at most once.

    Args:
        idem: the async runner (``idemstore.Idempotency``): its store, ``lease_ttl``,
            ``retention``, ``on_failure`` (``"release"``: a failed message is redelivered
            and runs again; ``"hold"``: its redeliveries find the key held until the lease
            lapses), ``on_takeover`` (``"run"`` again after a consumer died mid-handler, or
            ``"refuse"``: dead-letter the message, never a second run) and serializer.
            A duplicate in flight never waits here: it goes back to the broker.
        key: a function of the ``Message`` returning its key (``message_id``, the default;
            ``body_pointer("/event_id")``; ``attribute("idempotency-key")``). ``None``
            from it means the message cannot be keyed: it is dead-lettered.
        scope: the records' scope (default ``"consumer"``); name the queue in it when
            message ids are only unique per queue.
        fingerprint_include: JSON pointers into a JSON body that the fingerprint is limited
            to; by default the fingerprint covers the body's bytes. The same key with another
            fingerprint is a conflict: dead-lettered.
        fingerprint_exclude: JSON pointers into a JSON body that the fingerprint leaves out
            (``"/sent_at"``).
        busy_delay: seconds before a message whose key another consumer holds comes back.
        failure_delay: seconds before a message whose handler raised comes back.
        on_duplicate: called with the message and the recorded result (as the serializer
            rebuilds it) when a delivery replays; before its ack.
        keep_visible: push the broker's deadline out while the handler runs (default).
    """

    __slots__ = (
        "_checked",
        "_on_duplicate",
        "busy_delay",
        "failure_delay",
        "keep_visible",
        "keying",
        "policy",
        "scope",
        "serializer",
    )

    def __init__(
        self,
        idem: Idempotency,
        *,
        key: Callable[[Message], str | None] = message_id,
        scope: str = "consumer",
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_exclude: Iterable[str] | None = None,
        busy_delay: float = 1.0,
        failure_delay: float = 0.0,
        on_duplicate: Callable[[Message, Any], Awaitable[None] | None] | None = None,
        keep_visible: bool = True,
    ) -> None:
        self.policy = ExecutionPolicy(
            idem.store,
            lease_ttl=idem.lease_ttl,
            retention=idem.retention,
            in_flight="reject",
            on_failure=idem.on_failure,
            on_takeover=idem.on_takeover,
            max_response_bytes=idem.max_response_bytes,
            consumer="consumer",
        )
        self.serializer: Serializer = idem.serializer
        self.keying = MessageKeying(
            key, fingerprint_include=fingerprint_include, fingerprint_exclude=fingerprint_exclude
        )
        self.scope = scope
        self.busy_delay = busy_delay
        self.failure_delay = failure_delay
        self._on_duplicate = on_duplicate
        self.keep_visible = keep_visible
        self._checked = False

    async def check_store(self) -> None:
        """The startup check of the store (``check_at_startup``), once: ``handle_all`` runs
        it before a consumer's first batch, so a missing schema stops the consumer with the
        migrate command instead of sending every message back."""
        if not self._checked:
            await check_at_startup(self.policy.store, door="consumer")
            self._checked = True

    def fingerprint(self, message: Message) -> str:
        """The message's fingerprint: its body, or the selected fields of its JSON body."""
        return self.keying.fingerprint(message)

    async def handle(
        self, delivery: Delivery, handler: Callable[[Message], Awaitable[Any]]
    ) -> Disposition:
        """Run ``handler(message)`` once for the message's key and settle the delivery.

        The handler's result is recorded with the runner's serializer; the handler may
        instead record it itself, in its own database transaction, with
        ``current_execution().settle(data, connection=conn)`` (exactly-once effects on a
        SQL store of the same database). Cancellation propagates, the delivery untouched.
        """
        message = delivery.message
        try:
            key = self.keying.key(message)
            print_ = self.keying.fingerprint(message)
        except UNKEYABLE as exc:
            logger.warning("message %r dead-lettered: %s", message.id, exc)
            await delivery.dead_letter()
            return Disposition.DEAD_LETTERED
        stored: list[bool] = []
        try:
            result = await self.policy.run(
                key, print_, lambda: self._run(delivery, handler, stored), scope=self.scope
            )
        except Exception as exc:
            return await self._refused(delivery, key, exc)
        if result.replayed:
            if self._on_duplicate is not None:
                try:
                    pending = self._on_duplicate(message, self.serializer.loads(result.value, Any))
                    if pending is not None:
                        await pending
                except Exception:
                    logger.exception("on_duplicate failed for message %r", message.id)
            await delivery.ack()
            return Disposition.REPLAYED
        if stored and not stored[0]:
            logger.warning(
                "message %r: its key %r was taken over while the handler ran; not acked",
                message.id,
                key,
            )
            await delivery.leave()
            return Disposition.FENCED_OUT
        await delivery.ack()
        return Disposition.PROCESSED

    async def _run(
        self,
        delivery: Delivery,
        handler: Callable[[Message], Awaitable[Any]],
        stored: list[bool],
    ) -> bytes:
        execution = current_execution()
        assert execution is not None
        keeper = _VisibilityKeeper(execution, delivery, self.policy.lease_ttl)
        if not self.keep_visible:
            keeper.stop()
        try:
            value = await handler(delivery.message)
        finally:
            keeper.stop()
        if execution.finished:  # the handler settled in its own transaction
            return b""
        try:
            data = self.serializer.dumps(value)
        except Exception as exc:
            why = f"the handler returned {type(value).__qualname__}, not recordable: {exc}"
            raise await execution.settle_unrecordable(why) from exc
        stored.append(await execution.settle(data))
        return data

    async def _refused(self, delivery: Delivery, key: str, exc: Exception) -> Disposition:
        refusal = refusal_of(exc)
        message = delivery.message
        if refusal is None:
            logger.warning("handler of message %r (key %r) failed", message.id, key, exc_info=exc)
            await delivery.retry_later(self.failure_delay)
            return Disposition.FAILED
        if refusal in _DEAD_LETTER:
            logger.warning("message %r dead-lettered: %s", message.id, exc)
            await delivery.dead_letter()
            return Disposition.DEAD_LETTERED
        if refusal is Refusal.OUTCOME_UNRECORDED:
            logger.warning("message %r acked; its handler ran: %s", message.id, exc)
            await delivery.ack()
            return Disposition.UNRECORDED
        # In progress elsewhere, store unreachable or too slow, schema missing: come back.
        await delivery.retry_later(self.busy_delay)
        return Disposition.BUSY


class _VisibilityKeeper:
    """Pushes the delivery's broker deadline out by the lease's length every third of it,
    as the lease heartbeat does the lease, until stopped or the heartbeat finds the lease
    lost: then the broker's deadline runs out with the lease, not after it."""

    __slots__ = ("_delivery", "_execution", "_loop", "_stopped", "_task", "_timer", "_ttl")

    def __init__(self, execution: Execution, delivery: Delivery, lease_ttl: float) -> None:
        self._execution = execution
        self._delivery = delivery
        self._ttl = lease_ttl
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        # A timer, not a task: most handlers end before the first beat is due.
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(lease_ttl / 3, self._due)

    def _due(self) -> None:
        self._timer = None
        execution = self._execution
        if execution.finished or execution.lapsed:
            return
        self._task = self._loop.create_task(self._beat(), name="idemstore-visibility")

    async def _beat(self) -> None:
        try:
            await self._delivery.keep(self._ttl)
        except Exception:
            logger.warning("could not extend message %r", self._delivery.message.id, exc_info=True)
        self._task = None
        if not self._stopped:
            self._timer = self._loop.call_later(self._ttl / 3, self._due)

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


class Polling:
    """The loop of a consumer that pulls (SQS, Redis Streams, NATS JetStream): poll until
    ``stop()``; a failed read is logged and retried after ``RETRY_DELAY``, never ends it."""

    __slots__ = ("_stopping",)

    def __init__(self) -> None:
        self._stopping = False

    async def run(
        self,
        poll_once: Callable[[], Awaitable[Sequence[object]]],
        source: str,
        *,
        idle_delay: float = 0.0,
    ) -> None:
        """Call ``poll_once`` until ``stop()`` or cancellation; after a poll that brought
        nothing, wait ``idle_delay`` seconds (for a broker that answers at once when empty)."""
        self._stopping = False
        while not self._stopping:
            try:
                handled = await poll_once()
            except Exception:
                logger.exception("reading from %s failed; retrying", source)
                await asyncio.sleep(RETRY_DELAY)
                continue
            if not handled and idle_delay:
                await asyncio.sleep(idle_delay)

    def stop(self) -> None:
        """End ``run`` after the poll in hand."""
        self._stopping = True
