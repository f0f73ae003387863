"""The ``consumers`` bench scenario: what ``idemstore.consumers`` adds to handling a message.

Per broker (SQS on moto's server, Redis Streams, RabbitMQ, NATS JetStream: each started on
loopback from the binaries on PATH, as the tests do), the same adapter consumes the same
messages two ways, in interleaved rounds: through a plain door that runs the handler and acks
(the floor: the same consumer without idemstore), and through ``ConsumerDoor`` over the first
target's store (the subject). Each round publishes its messages first, then times every
message from the start of its handling to its ack. ``added_p50_ms`` is the per-message
overhead of the door: one reserve and one complete on the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.backends.urls import open_store, redact_url
from idemstore.bench.results import Measurement, Timing, Unavailable
from idemstore.consumers import ConsumerDoor, Disposition
from idemstore.runner import Idempotency

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from idemstore.bench.runner import Target
    from idemstore.bench.scenarios import Load
    from idemstore.consumers import Delivery, Message

__all__ = ["BROKERS", "run_consumers"]

BROKERS = ("sqs", "redis-streams", "rabbitmq", "nats")
ROUNDS = 4
FLOOR = "same consumer, no idemstore"
SCOPE = "idemstore-bench"
RETENTION = 3600.0
BATCH = 10


@dataclass(slots=True)
class _Policy:
    lease_ttl: float = 30.0


class _PlainDoor:
    """The floor: the handler, then the ack; what a consumer without idemstore does."""

    policy = _Policy()

    async def check_store(self) -> None:
        """No store to check (``handle_all`` asks every door before its first batch)."""

    async def handle(
        self, delivery: Delivery, handler: Callable[[Message], Awaitable[Any]]
    ) -> Disposition:
        await handler(delivery.message)
        await delivery.ack()
        return Disposition.PROCESSED


class _Timed:
    """A door that times each message's handling, ack included, into ``timing``."""

    def __init__(self, door: Any, timing: Timing) -> None:
        self.door = door
        self.policy = door.policy
        self.timing = timing

    async def check_store(self) -> None:
        await self.door.check_store()

    async def handle(
        self, delivery: Delivery, handler: Callable[[Message], Awaitable[Any]]
    ) -> Disposition:
        begun = time.perf_counter_ns()
        outcome: Disposition = await self.door.handle(delivery, handler)
        self.timing.latencies_ns.append(time.perf_counter_ns() - begun)
        self.timing.executions += outcome is Disposition.PROCESSED
        self.timing.unique_keys += 1
        return outcome


async def _handler(message: Message) -> str:
    return "ok"


class _Broker:
    """One broker for the scenario: publish ``count`` messages, consume them through a door."""

    name: str

    async def publish(self, count: int) -> None:
        raise NotImplementedError

    async def drain(self, door: Any, count: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class _SQS(_Broker):
    name = "sqs"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def open(self) -> None:
        from aiobotocore.session import get_session

        self._context = get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=self.endpoint
        )
        self.client = await self._context.__aenter__()
        reply = await self.client.create_queue(QueueName=f"bench-{uuid.uuid4().hex[:8]}")
        self.queue = reply["QueueUrl"]

    async def publish(self, count: int) -> None:
        for start in range(0, count, 10):
            entries = [
                {"Id": str(n), "MessageBody": uuid.uuid4().hex}
                for n in range(start, min(count, start + 10))
            ]
            await self.client.send_message_batch(QueueUrl=self.queue, Entries=entries)

    async def drain(self, door: Any, count: int) -> None:
        from idemstore.consumers.sqs import SQSConsumer

        consumer = SQSConsumer(door, self.client, self.queue, _handler, wait_time=0)
        done = 0
        while done < count:
            done += len(await consumer.poll_once())

    async def close(self) -> None:
        await self.client.delete_queue(QueueUrl=self.queue)
        await self._context.__aexit__(None, None, None)


class _RedisStreams(_Broker):
    name = "redis-streams"

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self.client = redis.asyncio.Redis.from_url(url)
        self.stream = f"bench-{uuid.uuid4().hex[:8]}"

    async def publish(self, count: int) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for _ in range(count):
                pipe.xadd(self.stream, {"body": uuid.uuid4().hex})
            await pipe.execute()

    async def drain(self, door: Any, count: int) -> None:
        from idemstore.consumers.redis_streams import RedisStreamConsumer

        consumer = RedisStreamConsumer(
            door, self.client, self.stream, "bench", "c", _handler, count=BATCH, block=0.05
        )
        done = 0
        while done < count:
            done += len(await consumer.poll_once())

    async def close(self) -> None:
        await self.client.delete(self.stream)
        await self.client.aclose()


class _RabbitMQ(_Broker):
    name = "rabbitmq"

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(self.url)
        self.channel = await self.connection.channel()
        await self.channel.set_qos(prefetch_count=BATCH)
        self.queue = await self.channel.declare_queue(f"bench-{uuid.uuid4().hex[:8]}")

    async def publish(self, count: int) -> None:
        import aio_pika

        for _ in range(count):
            await self.channel.default_exchange.publish(
                aio_pika.Message(b"{}", message_id=uuid.uuid4().hex), routing_key=self.queue.name
            )

    async def drain(self, door: Any, count: int) -> None:
        from idemstore.consumers.rabbitmq import RabbitMQConsumer

        done = asyncio.Event()
        handled = [0]

        async def counted(message: Message) -> str:
            return await _handler(message)

        class Counting:
            policy = door.policy

            async def check_store(self) -> None:
                await door.check_store()

            async def handle(self, delivery: Delivery, handler: Any) -> Disposition:
                outcome: Disposition = await door.handle(delivery, handler)
                handled[0] += 1
                if handled[0] >= count:
                    done.set()
                return outcome

        async with RabbitMQConsumer(Counting(), self.queue, counted):  # type: ignore[arg-type]
            await done.wait()

    async def close(self) -> None:
        await self.queue.delete()
        await self.connection.close()


class _Nats(_Broker):
    name = "nats"

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        import nats

        self.connection = await nats.connect(self.url)
        self.js = self.connection.jetstream()
        self.stream = f"bench{uuid.uuid4().hex[:8]}"
        await self.js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"])

    async def publish(self, count: int) -> None:
        for _ in range(count):
            await self.js.publish(f"{self.stream}.m", b"{}")

    async def drain(self, door: Any, count: int) -> None:
        from idemstore.consumers.nats import JetStreamConsumer

        consumer = JetStreamConsumer(
            door, self.js, f"{self.stream}.m", "bench", _handler, batch=BATCH, fetch_timeout=0.5
        )
        done = 0
        while done < count:
            done += len(await consumer.poll_once())
        await consumer.close()

    async def close(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.connection.close()


@contextlib.asynccontextmanager
async def _started(name: str) -> AsyncIterator[_Broker]:
    """The broker ``name`` on loopback for the block (``ServerUnavailableError`` if not)."""
    if name == "sqs":
        from idemstore.local_servers.dynamodb import start_dynamodb

        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(variable, "bench")
        server: Any = await asyncio.to_thread(start_dynamodb)
        broker: Any = _SQS(server.url)
    elif name == "redis-streams":
        from idemstore.local_servers.redis import start_redis

        server = await asyncio.to_thread(start_redis)
        broker = _RedisStreams(server.url)
    elif name == "rabbitmq":
        from idemstore.local_servers.rabbitmq import start_rabbitmq

        server = await asyncio.to_thread(start_rabbitmq)
        broker = _RabbitMQ(server.url)
    else:
        from idemstore.local_servers.nats import start_nats

        server = await asyncio.to_thread(start_nats)
        broker = _Nats(server.url)
    try:
        if hasattr(broker, "open"):
            await broker.open()
        try:
            yield broker
        finally:
            await broker.close()
    finally:
        await asyncio.to_thread(server.stop)


async def _one_broker(name: str, target: Target, load: Load) -> Measurement:
    per_round = max(BATCH, (load.ops or 1000) // (2 * ROUNDS))
    floor, subject = Timing(), Timing()
    async with _started(name) as broker, open_store(target.url) as store:
        door = ConsumerDoor(Idempotency(store, retention=RETENTION), scope=SCOPE)
        for r in range(ROUNDS):
            sides = [(_PlainDoor(), floor), (door, subject)]
            for plain_or_door, timing in sides if r % 2 == 0 else reversed(sides):
                await broker.publish(per_round)
                started = time.perf_counter()
                await broker.drain(_Timed(plain_or_door, timing), per_round)
                timing.seconds += time.perf_counter() - started
    measurement = Measurement.of_one_caller(
        f"{name} / {target.name}",
        "consumers",
        subject,
        floor,
        FLOOR,
        url=redact_url(target.url),
        notes={"broker": name, "batch": BATCH},
    )
    ratio = measurement.ratio_p50
    if ratio is not None:
        measurement.notes["ratio_p50"] = round(ratio, 3)
    return measurement


async def run_consumers(
    targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """Every broker, over the first target's store; a broker that cannot start (its binary
    or driver missing) is ``Unavailable``, and the others still run."""
    measured: list[Measurement | Unavailable] = []
    if not targets:
        return measured
    target = targets[0]
    for name in BROKERS:
        try:
            measured.append(await _one_broker(name, target, load))
        except ImportError as exc:  # MissingDependencyError too: an extra not installed
            extra = "redis" if name == "redis-streams" else name
            why = f"{type(exc).__name__}: {exc}"
            measured.append(Unavailable(name, why, "consumers", extra=extra))
        except Exception as exc:
            measured.append(Unavailable(name, f"{type(exc).__name__}: {exc}", "consumers"))
    return measured
