"""Amazon SQS: a long-running consumer over an aiobotocore client.

``SQSConsumer(door, client, queue_url, handler)`` receives batches (long polling), hands
each message to the door, and deletes it once its outcome is recorded. While a handler runs,
``ChangeMessageVisibility`` keeps the message invisible by the lease's length at each
heartbeat; a message whose key another consumer holds is made visible again after the door's
``busy_delay``. SQS has no reject: a message the door dead-letters is made visible at once,
and the queue's redrive policy (``maxReceiveCount``) moves it to its dead-letter queue.
Receive with a visibility timeout of at least the lease's length (``visibility_timeout``,
default: the lease's length).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from idemstore.consumers.door import Polling, handle_all
from idemstore.consumers.messages import Message

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.consumers.door import ConsumerDoor, Disposition

__all__ = ["SQSConsumer", "SQSDelivery", "sqs_message"]

# The SQS limit on a visibility timeout, in seconds (12 hours).
_MAX_VISIBILITY = 43200


def sqs_message(raw: dict[str, Any]) -> Message:
    """A door ``Message`` from an SQS message, as ``ReceiveMessage`` or a Lambda event gives
    it (``MessageId``/``messageId``, ``Body``/``body``, message attributes as text)."""
    attributes: dict[str, str] = {}
    for name, value in (raw.get("MessageAttributes") or raw.get("messageAttributes") or {}).items():
        text = value.get("StringValue", value.get("stringValue"))
        if text is not None:
            attributes[name] = str(text)
    system = raw.get("Attributes") or raw.get("attributes") or {}
    count = system.get("ApproximateReceiveCount")
    body = raw.get("Body", raw.get("body", ""))
    return Message(
        id=str(raw.get("MessageId") or raw.get("messageId") or ""),
        body=body.encode("utf-8") if isinstance(body, str) else bytes(body),
        attributes=attributes,
        redelivered=count is not None and int(count) > 1,
        delivery_count=None if count is None else int(count),
        raw=raw,
    )


def _seconds(value: float) -> int:
    return max(0, min(_MAX_VISIBILITY, math.ceil(value)))


class SQSDelivery:
    """One received SQS message and its receipt handle."""

    __slots__ = ("_client", "_queue_url", "_receipt", "message")

    def __init__(self, client: Any, queue_url: str, raw: dict[str, Any]) -> None:
        self._client = client
        self._queue_url = queue_url
        self._receipt = raw["ReceiptHandle"]
        self.message = sqs_message(raw)

    async def ack(self) -> None:
        await self._client.delete_message(QueueUrl=self._queue_url, ReceiptHandle=self._receipt)

    async def retry_later(self, delay: float) -> None:
        await self._visible_in(delay)

    async def keep(self, seconds: float) -> None:
        await self._visible_in(seconds)

    async def leave(self) -> None:
        """The visibility timeout runs out by itself."""

    async def dead_letter(self) -> None:
        # Visible now: the redrive policy counts this receive and moves it on at its limit.
        await self._visible_in(0)

    async def _visible_in(self, seconds: float) -> None:
        await self._client.change_message_visibility(
            QueueUrl=self._queue_url,
            ReceiptHandle=self._receipt,
            VisibilityTimeout=_seconds(seconds),
        )


class SQSConsumer:
    """Receive from ``queue_url`` and hand every message to ``door`` with ``handler``.

    Args:
        door: the ``ConsumerDoor`` (key, fingerprint, policies).
        client: an aiobotocore SQS client (open: ``async with session.create_client("sqs")``).
        queue_url: the queue.
        handler: ``async def handler(message: Message)``; what it returns is recorded.
        batch_size: messages per receive (1 to 10); they are handled concurrently.
        wait_time: long-polling seconds per receive (0 to 20).
        visibility_timeout: seconds a received message stays invisible (default: the
            lease's length, so that the message and the lease lapse together).
        idle_delay: seconds ``run`` sleeps after a receive that brought nothing (for
            ``wait_time=0``, short polling).
    """

    __slots__ = (
        "_client",
        "_handler",
        "_polling",
        "batch_size",
        "door",
        "idle_delay",
        "queue_url",
        "visibility_timeout",
        "wait_time",
    )

    def __init__(
        self,
        door: ConsumerDoor,
        client: Any,
        queue_url: str,
        handler: Callable[[Message], Awaitable[Any]],
        *,
        batch_size: int = 10,
        wait_time: int = 1,
        visibility_timeout: float | None = None,
        idle_delay: float = 0.1,
    ) -> None:
        self.door = door
        self._client = client
        self.queue_url = queue_url
        self._handler = handler
        self.batch_size = batch_size
        self.wait_time = wait_time
        self.visibility_timeout = _seconds(
            door.policy.lease_ttl if visibility_timeout is None else visibility_timeout
        )
        self.idle_delay = idle_delay
        self._polling = Polling()

    async def poll_once(self) -> list[Disposition]:
        """Receive one batch (waiting up to ``wait_time``) and handle it; what became of
        each message, in the order received."""
        reply = await self._client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_time,
            VisibilityTimeout=self.visibility_timeout,
            MessageAttributeNames=["All"],
            AttributeNames=["ApproximateReceiveCount"],
        )
        deliveries = [
            SQSDelivery(self._client, self.queue_url, raw) for raw in reply.get("Messages", ())
        ]
        return await handle_all(self.door, deliveries, self._handler)

    async def run(self) -> None:
        """Consume until ``stop()`` or cancellation (a batch being handled is finished first
        after ``stop``; a cancellation leaves its messages to their visibility timeout)."""
        idle = self.idle_delay if self.wait_time == 0 else 0.0
        await self._polling.run(self.poll_once, self.queue_url, idle_delay=idle)

    def stop(self) -> None:
        """End ``run`` after the batch in hand."""
        self._polling.stop()
