"""Redis Streams: a consumer in a consumer group, over a redis-py asyncio client.

``RedisStreamConsumer(door, redis, stream, group, consumer, handler)`` reads new entries with
``XREADGROUP`` and acknowledges each with ``XACK`` once its outcome is recorded. Entries left
pending by a consumer that crashed (or one whose key was busy) are reclaimed with
``XAUTOCLAIM`` once idle for ``claim_idle`` seconds (default: the lease's length). While a
handler runs, an ``XCLAIM ... JUSTID`` by its own consumer resets the entry's idle time at
each heartbeat, so no other consumer reclaims a long handler's entry. Streams have no
dead-letter queue: a dead-lettered entry is copied to the stream ``dead_letter_stream``
(default ``<stream>.dead``), with its id, then acknowledged.

An entry's body is its field ``body`` (``body_field``); its other fields are its attributes.
Its ``Message.id`` is ``<stream>:<entry id>``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from idemstore.consumers.door import Polling, handle_all
from idemstore.consumers.messages import Message

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.consumers.door import ConsumerDoor, Disposition

__all__ = ["RedisStreamConsumer", "RedisStreamDelivery"]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisStreamDelivery:
    """One pending entry of ``stream``, delivered to ``consumer`` of ``group``."""

    __slots__ = (
        "_consumer",
        "_dead",
        "_entry",
        "_fields",
        "_group",
        "_redis",
        "_stream",
        "message",
    )

    def __init__(
        self,
        owner: RedisStreamConsumer,
        entry_id: Any,
        fields: dict[Any, Any],
        *,
        reclaimed: bool,
    ) -> None:
        self._redis = owner.redis
        self._stream = owner.stream
        self._group = owner.group
        self._consumer = owner.consumer
        self._dead = owner.dead_letter_stream
        self._entry = _text(entry_id)
        self._fields = fields
        decoded = {_text(k): v for k, v in fields.items()}
        body = decoded.pop(owner.body_field, b"")
        self.message = Message(
            id=f"{owner.stream}:{self._entry}",
            body=body if isinstance(body, bytes) else str(body).encode("utf-8"),
            attributes={k: _text(v) for k, v in decoded.items()},
            redelivered=reclaimed,
            raw=(self._entry, fields),
        )

    async def ack(self) -> None:
        await self._redis.xack(self._stream, self._group, self._entry)

    async def retry_later(self, delay: float) -> None:
        """Left pending: ``XAUTOCLAIM`` reclaims it once idle for ``claim_idle``."""

    async def keep(self, seconds: float) -> None:
        # Resets the entry's idle time (its owner stays this consumer): not reclaimable.
        await self._redis.xclaim(
            self._stream, self._group, self._consumer, 0, [self._entry], justid=True
        )

    async def leave(self) -> None:
        """Left pending, to whoever reclaims it."""

    async def dead_letter(self) -> None:
        fields = {**self._fields, "dead_letter_of": self._entry}
        await self._redis.xadd(self._dead, fields)
        await self._redis.xack(self._stream, self._group, self._entry)


class RedisStreamConsumer:
    """Consume ``stream`` as ``consumer`` of ``group``, handing each entry to ``door``.

    Args:
        door: the ``ConsumerDoor``.
        redis: a ``redis.asyncio.Redis`` client.
        stream: the stream.
        group: its consumer group (created, with the stream, from the stream's start if
            missing).
        consumer: this consumer's name in the group.
        handler: ``async def handler(message: Message)``; what it returns is recorded.
        count: entries per read; handled concurrently.
        block: seconds a read waits for new entries.
        claim_idle: seconds an entry must be pending untouched before ``XAUTOCLAIM`` takes
            it (default: the lease's length).
        body_field: the entry field holding the body.
        dead_letter_stream: where dead-lettered entries go (default ``<stream>.dead``).
    """

    __slots__ = (
        "_handler",
        "_polling",
        "_ready",
        "block",
        "body_field",
        "claim_idle",
        "consumer",
        "count",
        "dead_letter_stream",
        "door",
        "group",
        "redis",
        "stream",
    )

    def __init__(
        self,
        door: ConsumerDoor,
        redis: Any,
        stream: str,
        group: str,
        consumer: str,
        handler: Callable[[Message], Awaitable[Any]],
        *,
        count: int = 10,
        block: float = 1.0,
        claim_idle: float | None = None,
        body_field: str = "body",
        dead_letter_stream: str | None = None,
    ) -> None:
        self.door = door
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._handler = handler
        self.count = count
        self.block = block
        self.claim_idle = door.policy.lease_ttl if claim_idle is None else claim_idle
        self.body_field = body_field
        self.dead_letter_stream = dead_letter_stream or f"{stream}.dead"
        self._ready = False
        self._polling = Polling()

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists."""
        from redis.exceptions import ResponseError

        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._ready = True

    async def poll_once(self) -> list[Disposition]:
        """Reclaim idle pending entries, else read new ones (waiting up to ``block``), and
        handle them; what became of each."""
        if not self._ready:
            await self.ensure_group()
        deliveries = await self._reclaimed()
        if not deliveries:
            reply = await self.redis.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=self.count,
                block=max(1, math.ceil(self.block * 1000)),
            )
            for _stream, entries in reply or ():
                deliveries += [
                    RedisStreamDelivery(self, entry_id, fields, reclaimed=False)
                    for entry_id, fields in entries
                    if fields is not None
                ]
        return await handle_all(self.door, deliveries, self._handler)

    async def _reclaimed(self) -> list[RedisStreamDelivery]:
        reply = await self.redis.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            max(1, math.ceil(self.claim_idle * 1000)),
            start_id="0-0",
            count=self.count,
        )
        entries = reply[1]
        return [
            RedisStreamDelivery(self, entry_id, fields, reclaimed=True)
            for entry_id, fields in entries
            if fields is not None  # deleted from the stream meanwhile
        ]

    async def run(self) -> None:
        """Consume until ``stop()`` or cancellation."""
        await self._polling.run(self.poll_once, self.stream)

    def stop(self) -> None:
        """End ``run`` after the entries in hand."""
        self._polling.stop()
