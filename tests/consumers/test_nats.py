"""The JetStream adapter against a nats-server of the session's own (nats-py)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Idempotency
from idemstore.consumers import ConsumerDoor, Disposition, Message, attribute

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[Any]:
    import nats

    connection = await nats.connect(nats_url)
    yield connection.jetstream()
    await connection.close()


@pytest.fixture
async def subject(js: Any) -> AsyncIterator[str]:
    name = f"s{uuid.uuid4().hex[:10]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    yield f"{name}.orders"
    await js.delete_stream(name)


async def settled(js: Any, subject: str) -> bool:
    """Whether the consumer ends with nothing pending or unacked (acks are published
    without waiting, so the server counts them a moment later)."""
    for _ in range(50):
        info = await js.consumer_info(subject.split(".")[0], "workers")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_long_handler_is_not_redelivered_past_ack_wait(
    store: IdempotencyStore, js: Any, subject: str
) -> None:
    from idemstore.consumers.nats import JetStreamConsumer

    door = ConsumerDoor(Idempotency(store, lease_ttl=1.0))
    runs: list[int | None] = []

    async def slow(message: Message) -> str:
        runs.append(message.delivery_count)
        await asyncio.sleep(2.5)
        return "ok"

    await js.publish(subject, b'{"order": 1}')
    one = JetStreamConsumer(door, js, subject, "workers", slow, fetch_timeout=0.2)
    two = JetStreamConsumer(door, js, subject, "workers", slow, fetch_timeout=0.2)
    first = asyncio.create_task(one.poll_once())
    await asyncio.sleep(0.3)
    seen_by_two: list[Disposition] = []
    while not first.done():
        seen_by_two += await two.poll_once()  # in-progress acks reset AckWait: nothing
    assert await first == [Disposition.PROCESSED]
    assert seen_by_two == []
    assert runs == [1]
    assert await two.poll_once() == []


async def test_duplicates_by_msg_id_run_once_and_busy_ones_come_back_after_their_nak_delay(
    store: IdempotencyStore, js: Any, subject: str
) -> None:
    from idemstore.consumers.nats import JetStreamConsumer

    runs: collections.Counter[str] = collections.Counter()

    async def handler(message: Message) -> str:
        runs[message.id] += 1
        await asyncio.sleep(0.1)
        return "ok"

    for n in range(5):
        for _ in range(2):  # same business event, twice: a header the stream does not dedup
            await js.publish(subject, json.dumps({"n": n}).encode(), headers={"Event": f"e{n}"})
    door = ConsumerDoor(Idempotency(store, lease_ttl=2.0), key=attribute("Event"), busy_delay=0.2)
    consumers = [
        JetStreamConsumer(door, js, subject, "workers", handler, fetch_timeout=0.2, batch=3)
        for _ in range(2)
    ]
    seen: list[Disposition] = []
    for _ in range(40):
        for batch in await asyncio.gather(*(c.poll_once() for c in consumers)):
            seen += batch
        if seen.count(Disposition.PROCESSED) + seen.count(Disposition.REPLAYED) == 10:
            break
    assert sorted(runs.values()) == [1] * 5
    assert seen.count(Disposition.PROCESSED) == 5
    assert seen.count(Disposition.REPLAYED) == 5
    assert await settled(js, subject)


async def test_a_dead_lettered_message_is_terminated(
    store: IdempotencyStore, js: Any, subject: str
) -> None:
    from idemstore.consumers import body_pointer
    from idemstore.consumers.nats import JetStreamConsumer

    door = ConsumerDoor(Idempotency(store), key=body_pointer("/event"))

    async def handler(message: Message) -> str:
        return "ok"

    await js.publish(subject, b"not json")
    consumer = JetStreamConsumer(door, js, subject, "workers", handler, fetch_timeout=0.2)
    assert await consumer.poll_once() == [Disposition.DEAD_LETTERED]
    await asyncio.sleep(0.2)
    assert await consumer.poll_once() == []
    assert await settled(js, subject)
