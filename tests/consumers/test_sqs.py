"""The SQS adapter against moto's server (one request at a time, so short polling)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Idempotency
from idemstore.consumers import ConsumerDoor, Disposition, Message, attribute
from idemstore.consumers.sqs import SQSConsumer
from tests.consumers.conftest import PausedHeartbeats

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow

REGION = "us-east-1"


@pytest.fixture
async def sqs(dynamodb_endpoint: str) -> AsyncIterator[Any]:
    """An aiobotocore SQS client on moto's server (which serves DynamoDB and SQS alike)."""
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=dynamodb_endpoint
    ) as client:
        yield client


@pytest.fixture
async def queue(sqs: Any) -> AsyncIterator[str]:
    reply = await sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:12]}")
    yield reply["QueueUrl"]
    await sqs.delete_queue(QueueUrl=reply["QueueUrl"])


async def drained(sqs: Any, queue: str) -> bool:
    reply = await sqs.get_queue_attributes(
        QueueUrl=queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    counts = reply["Attributes"]
    return (
        counts["ApproximateNumberOfMessages"]
        == counts["ApproximateNumberOfMessagesNotVisible"]
        == "0"
    )


async def test_a_handler_longer_than_the_visibility_timeout_is_not_redelivered(
    store: IdempotencyStore, sqs: Any, queue: str
) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=1.5))
    runs: list[str] = []

    async def slow(message: Message) -> str:
        runs.append(message.id)
        await asyncio.sleep(3.5)
        return "done"

    await sqs.send_message(QueueUrl=queue, MessageBody='{"order": 1}')
    worker = SQSConsumer(door, sqs, queue, slow, wait_time=0)
    other = SQSConsumer(door, sqs, queue, slow, wait_time=0)
    first = asyncio.create_task(worker.poll_once())
    await asyncio.sleep(0.3)
    seen_by_other: list[Disposition] = []
    while not first.done():
        seen_by_other += await other.poll_once()  # the visibility was extended: nothing
        await asyncio.sleep(0.2)
    assert await first == [Disposition.PROCESSED]
    assert seen_by_other == []
    assert len(runs) == 1
    assert await drained(sqs, queue)


async def test_racing_consumers_run_each_business_event_once_despite_duplicates(
    store: IdempotencyStore, sqs: Any, queue: str
) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=5), key=attribute("event-id"), busy_delay=0)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(message: Message) -> str:
        runs[message.attributes["event-id"]] += 1
        await asyncio.sleep(0.05)
        return "ok"

    events = [f"e-{n}" for n in range(8)]
    for event in events * 2:  # the producer sends every event twice
        await sqs.send_message(
            QueueUrl=queue,
            MessageBody=json.dumps({"event": event}),
            MessageAttributes={"event-id": {"DataType": "String", "StringValue": event}},
        )
    consumers = [
        SQSConsumer(door, sqs, queue, handler, wait_time=0, batch_size=4) for _ in range(3)
    ]
    tasks = [asyncio.create_task(c.run()) for c in consumers]
    try:
        for _ in range(100):
            if sum(runs.values()) == len(events) and await drained(sqs, queue):
                break
            await asyncio.sleep(0.1)
    finally:
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*tasks)
    assert runs == collections.Counter(events)
    assert await drained(sqs, queue)


async def test_a_consumer_stopped_past_lease_and_visibility_is_fenced_out_unacked(
    store: IdempotencyStore, sqs: Any, queue: str
) -> None:
    # The stopped consumer neither heartbeats its lease nor extends the message's visibility.
    stopped = ConsumerDoor(Idempotency(PausedHeartbeats(store), lease_ttl=1.0), keep_visible=False)
    live = ConsumerDoor(Idempotency(store, lease_ttl=1.0))
    woken = asyncio.Event()

    async def stalls(message: Message) -> str:
        await woken.wait()
        return "late"

    async def handler(message: Message) -> str:
        return "taken over"

    sent = await sqs.send_message(QueueUrl=queue, MessageBody='{"order": 1}')
    first = asyncio.create_task(SQSConsumer(stopped, sqs, queue, stalls, wait_time=0).poll_once())
    taker = SQSConsumer(live, sqs, queue, handler, wait_time=0)
    taken: list[Disposition] = []
    for _ in range(50):  # the message comes back once its visibility (1 s) runs out
        await asyncio.sleep(0.1)
        taken += await taker.poll_once()
        if taken:
            break
    assert taken == [Disposition.PROCESSED]
    woken.set()
    assert await first == [Disposition.FENCED_OUT]
    record = await store.get(sent["MessageId"], scope="consumer")
    assert record is not None and record.response is not None
    assert b"taken over" in record.response  # the stopped consumer's result was not recorded
    assert await drained(sqs, queue)  # the taker deleted it; the stopped one did not touch it
