"""The RabbitMQ adapter against a RabbitMQ node of the session's own (aio-pika)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Idempotency
from idemstore.consumers import ConsumerDoor, Disposition, Message

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow


@pytest.fixture
async def connection(rabbitmq_url: str) -> AsyncIterator[Any]:
    import aio_pika

    opened = await aio_pika.connect(rabbitmq_url)
    yield opened
    await opened.close()


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


async def publish(channel: Any, queue: str, body: Any, message_id: str) -> None:
    import aio_pika

    await channel.default_exchange.publish(
        aio_pika.Message(json.dumps(body).encode(), message_id=message_id), routing_key=queue
    )


async def ready(channel: Any, queue: str) -> int:
    """Messages ready in ``queue`` (none unacked either, once its consumers are gone)."""
    declared = await channel.declare_queue(queue, passive=True)
    count: int = declared.declaration_result.message_count
    return count


async def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_two_consumers_with_prefetch_run_each_message_id_once(
    store: IdempotencyStore, connection: Any, queue_name: str
) -> None:
    from idemstore.consumers.rabbitmq import RabbitMQConsumer

    door = ConsumerDoor(Idempotency(store), busy_delay=0.05)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(message: Message) -> str:
        runs[message.id] += 1
        await asyncio.sleep(0.05)
        return "ok"

    async def counted(message: Message) -> str:
        return await handler(message)

    consumers = []
    for _ in range(2):
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=5)
        queue = await channel.declare_queue(queue_name, auto_delete=False)
        consumers.append(RabbitMQConsumer(door, queue, counted))
    publisher = await connection.channel()
    ids = [f"m-{n}" for n in range(10)]
    for message_id in ids * 2:  # every message sent twice, as a producer retrying does
        await publish(publisher, queue_name, {"id": message_id}, message_id)
    for consumer in consumers:
        await consumer.start()
    await until(lambda: sum(runs.values()) >= len(ids))
    await asyncio.sleep(0.3)  # the duplicates and any busy requeues settle
    for consumer in consumers:
        await consumer.stop()
    assert runs == {message_id: 1 for message_id in ids}
    assert await ready(publisher, queue_name) == 0


async def test_an_outcome_recorded_but_not_acked_is_redelivered_and_replayed(
    store: IdempotencyStore, connection: Any, queue_name: str
) -> None:
    from idemstore.consumers.rabbitmq import RabbitMQDelivery

    door = ConsumerDoor(Idempotency(store))
    runs: list[bool] = []

    async def handler(message: Message) -> str:
        runs.append(message.redelivered)
        return "ok"

    publisher = await connection.channel()
    await publisher.declare_queue(queue_name)
    await publish(publisher, queue_name, {"order": 1}, "m-1")

    class AckLost(RabbitMQDelivery):
        async def ack(self) -> None:  # the consumer dies between recording and acking
            pass

    dying = await connection.channel()
    queue = await dying.declare_queue(queue_name)
    first = await queue.get(no_ack=False)
    assert await door.handle(AckLost(first), handler) is Disposition.PROCESSED
    await dying.close()  # the channel goes: RabbitMQ redelivers, flagged redelivered
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name)
    again = await queue.get(no_ack=False)
    assert again.redelivered
    assert await door.handle(RabbitMQDelivery(again), handler) is Disposition.REPLAYED
    assert runs == [False]
    assert await ready(channel, queue_name) == 0


async def test_a_conflicting_message_goes_to_the_dead_letter_exchange(
    store: IdempotencyStore, connection: Any, queue_name: str
) -> None:
    from idemstore.consumers.rabbitmq import RabbitMQDelivery

    door = ConsumerDoor(Idempotency(store))

    async def handler(message: Message) -> str:
        return "ok"

    channel = await connection.channel()
    dead = await channel.declare_queue(f"{queue_name}.dead")
    queue = await channel.declare_queue(
        queue_name,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead.name},
    )
    await publish(channel, queue_name, {"amount": 1}, "m-1")
    await publish(channel, queue_name, {"amount": 2}, "m-1")  # same id, other body
    first = await queue.get(no_ack=False)
    assert await door.handle(RabbitMQDelivery(first), handler) is Disposition.PROCESSED
    second = await queue.get(no_ack=False)
    assert await door.handle(RabbitMQDelivery(second), handler) is Disposition.DEAD_LETTERED
    for _ in range(50):
        moved = await dead.get(no_ack=True, fail=False)
        if moved is not None:
            break
        await asyncio.sleep(0.05)
    assert moved is not None and json.loads(moved.body) == {"amount": 2}
