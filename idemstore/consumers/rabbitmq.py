"""RabbitMQ: a consumer over an aio-pika queue, manual acks, any prefetch.

``RabbitMQConsumer(door, queue, handler)`` consumes with manual acknowledgements (the
channel's ``set_qos(prefetch_count=...)`` bounds how many messages are handled at once) and
acks each message once its outcome is recorded. A message whose key another consumer holds
(or whose handler raised) is nacked with ``requeue=True`` after the door's delay; one the door
dead-letters is rejected without requeue, so the queue's dead-letter exchange gets it.

RabbitMQ has no visibility timeout: a delivery stays with its consumer until acked or until
its channel closes (the connection's heartbeat notices a dead or stopped consumer, and
``consumer_timeout`` bounds a delivery's life), so ``keep`` sends nothing. The key is the
AMQP ``message_id`` property by default: producers must set it (a message without one is
dead-lettered), or give the door a ``key`` from the body or a header.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.consumers.door import logger
from idemstore.consumers.messages import Message

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.consumers.door import ConsumerDoor, Disposition

__all__ = ["RabbitMQConsumer", "RabbitMQDelivery"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RabbitMQDelivery:
    """One delivery of an ``aio_pika`` incoming message."""

    __slots__ = ("_raw", "message")

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.message = Message(
            id=raw.message_id or "",
            body=bytes(raw.body),
            attributes={str(k): _text(v) for k, v in (raw.headers or {}).items()},
            redelivered=bool(raw.redelivered),
            raw=raw,
        )

    async def ack(self) -> None:
        await self._raw.ack()

    async def retry_later(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        await self._raw.nack(requeue=True)

    async def keep(self, seconds: float) -> None:
        """Nothing to send: the delivery is this consumer's until its channel closes."""

    async def leave(self) -> None:
        # This delivery is ours alone (the key's new holder got another one): give it back,
        # and its redelivery replays the holder's outcome.
        await self._raw.nack(requeue=True)

    async def dead_letter(self) -> None:
        await self._raw.reject(requeue=False)


class RabbitMQConsumer:
    """Consume ``queue`` (an ``aio_pika`` queue), handing each message to ``door``.

    ``await start()`` subscribes; ``await stop()`` cancels the subscription and waits for the
    messages in hand. Also an async context manager doing both.
    """

    __slots__ = ("_handler", "_tag", "_tasks", "door", "queue")

    def __init__(
        self,
        door: ConsumerDoor,
        queue: Any,
        handler: Callable[[Message], Awaitable[Any]],
    ) -> None:
        self.door = door
        self.queue = queue
        self._handler = handler
        self._tag: str | None = None
        self._tasks: set[asyncio.Task[Disposition]] = set()

    async def start(self) -> None:
        await self.door.check_store()  # a missing schema stops it before any message
        self._tag = await self.queue.consume(self._received, no_ack=False)

    async def _received(self, raw: Any) -> None:
        task = asyncio.get_running_loop().create_task(
            self.door.handle(RabbitMQDelivery(raw), self._handler)
        )
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Disposition]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("handling a RabbitMQ message failed: %s", error, exc_info=error)

    async def stop(self) -> None:
        if self._tag is not None:
            await self.queue.cancel(self._tag)
            self._tag = None
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def __aenter__(self) -> RabbitMQConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
