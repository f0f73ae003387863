"""NATS JetStream: a pull consumer over nats-py.

``JetStreamConsumer(door, js, subject, durable, handler)`` fetches batches from a durable
pull consumer and acks each message once its outcome is recorded. While a handler runs, an
in-progress ack (``+WPI``) at each heartbeat resets the consumer's ``AckWait``, which is set
to the lease's length (``ack_wait``), so the message and the lease lapse together. A message
whose key another consumer holds (or whose handler raised) is nacked with the door's delay
(``Nak`` with a delay); one the door dead-letters is terminated (``+TERM``: JetStream stops
redelivering it; an advisory reports it, for a dead-letter flow to pick up).

The key is the ``Nats-Msg-Id`` header when the producer set one (JetStream's own
de-duplication id), else ``<stream>:<stream sequence>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore import MissingDependencyError
from idemstore.consumers.door import Polling, handle_all
from idemstore.consumers.messages import Message
from idemstore.install_lines import install_hint

try:
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.api import AckPolicy, ConsumerConfig
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.consumers.nats needs nats-py: " + install_hint("nats")
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.consumers.door import ConsumerDoor, Disposition

__all__ = ["JetStreamConsumer", "JetStreamDelivery"]


class JetStreamDelivery:
    """One delivery of a JetStream message (``nats.aio.msg.Msg``)."""

    __slots__ = ("_raw", "message")

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        headers = dict(raw.headers or {})
        meta = raw.metadata
        identifier = headers.get("Nats-Msg-Id") or f"{meta.stream}:{meta.sequence.stream}"
        self.message = Message(
            id=identifier,
            body=bytes(raw.data),
            attributes={str(k): str(v) for k, v in headers.items()},
            redelivered=meta.num_delivered > 1,
            delivery_count=meta.num_delivered,
            raw=raw,
        )

    async def ack(self) -> None:
        await self._raw.ack()

    async def retry_later(self, delay: float) -> None:
        await self._raw.nak(delay=delay if delay > 0 else None)

    async def keep(self, seconds: float) -> None:
        # Resets AckWait to its configured length (the lease's, by default).
        await self._raw.in_progress()

    async def leave(self) -> None:
        """AckWait runs out by itself; the key's holder has its own delivery."""

    async def dead_letter(self) -> None:
        await self._raw.term()


class JetStreamConsumer:
    """Fetch from the durable pull consumer ``durable`` on ``subject``; hand each message to
    ``door``.

    Args:
        door: the ``ConsumerDoor``.
        handler: ``async def handler(message: Message)``; what it returns is recorded.
        js: a ``JetStreamContext`` (``nc.jetstream()``).
        subject: what to consume.
        durable: the durable consumer's name.
        stream: its stream (looked up from the subject when ``None``).
        batch: messages per fetch, handled concurrently.
        fetch_timeout: seconds a fetch waits for messages.
        ack_wait: the consumer's ``AckWait`` when it is created (default: the lease's
            length).
        max_deliver: the consumer's ``MaxDeliver`` when it is created (default: unlimited).
    """

    __slots__ = (
        "_handler",
        "_js",
        "_polling",
        "_sub",
        "ack_wait",
        "batch",
        "door",
        "durable",
        "fetch_timeout",
        "max_deliver",
        "stream",
        "subject",
    )

    def __init__(
        self,
        door: ConsumerDoor,
        js: Any,
        subject: str,
        durable: str,
        handler: Callable[[Message], Awaitable[Any]],
        *,
        stream: str | None = None,
        batch: int = 10,
        fetch_timeout: float = 1.0,
        ack_wait: float | None = None,
        max_deliver: int | None = None,
    ) -> None:
        self.door = door
        self._js = js
        self.subject = subject
        self.durable = durable
        self._handler = handler
        self.stream = stream
        self.batch = batch
        self.fetch_timeout = fetch_timeout
        self.ack_wait = door.policy.lease_ttl if ack_wait is None else ack_wait
        self.max_deliver = max_deliver
        self._sub: Any = None
        self._polling = Polling()

    async def subscribe(self) -> None:
        """Bind to the durable consumer, creating it (explicit acks) if it is missing."""
        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
        )
        self._sub = await self._js.pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=config
        )

    async def poll_once(self) -> list[Disposition]:
        """Fetch one batch (waiting up to ``fetch_timeout``) and handle it."""
        if self._sub is None:
            await self.subscribe()
        try:
            messages = await self._sub.fetch(self.batch, timeout=self.fetch_timeout)
        except (TimeoutError, NatsTimeoutError):
            return []
        deliveries = [JetStreamDelivery(m) for m in messages]
        return await handle_all(self.door, deliveries, self._handler)

    async def run(self) -> None:
        """Consume until ``stop()`` or cancellation."""
        await self._polling.run(self.poll_once, self.subject)

    def stop(self) -> None:
        """End ``run`` after the messages in hand."""
        self._polling.stop()

    async def close(self) -> None:
        """Unsubscribe (the durable consumer stays on the server)."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
