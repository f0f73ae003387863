"""docs/consumers.md's broker snippets, run against the test brokers: each consumes a message
its test publishes, runs the page's handler once, and is stopped.

Placeholders filled here: the brokers' and the store's URLs (loopback servers of the session),
the SQS endpoint and queue, and long polling (moto's server answers one request at a time).
The page's ``door`` and ``charge`` come from its first example, rebuilt here on a memory store.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Idempotency, open_store
from idemstore.consumers import ConsumerDoor, Message
from tests.docs.markdown_blocks import ROOT, blocks_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "consumers.md"


def snippet(containing: str) -> str:
    (block,) = (b for b in blocks_of(PAGE) if b.marker == "tested-by" and containing in b.source)
    return block.source


async def run_snippet(
    source: str, names: dict[str, Any], publish: Callable[[], Awaitable[None]]
) -> list[str]:
    """Run ``source`` as an async function's body until the page's ``charge`` saw one
    message, then cancel it; the orders charged."""
    charged: list[str] = []

    async def charge(message: Message) -> dict[str, Any]:
        charged.append(message.json()["order_id"])
        return {"charged": True}

    opened: list[Any] = []  # connections the snippet opens and never closes (it runs forever)
    namespace: dict[str, Any] = {"asyncio": asyncio, "charge": charge, "opened": opened, **names}
    namespace.setdefault("door", ConsumerDoor(Idempotency(open_store("memory://"), lease_ttl=30)))
    exec(
        compile("async def example():\n" + textwrap.indent(source, "    "), PAGE, "exec"), namespace
    )
    await publish()
    task = asyncio.create_task(namespace["example"]())
    try:
        for _ in range(200):
            if charged or task.done():
                break
            await asyncio.sleep(0.05)
        if task.done():
            task.result()  # the snippet's own error
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for connection in opened:
            await connection.close()
    return charged


async def test_the_sqs_snippet(dynamodb_endpoint: str, redis_store_url: str) -> None:
    from aiobotocore.session import get_session

    source = (
        snippet("SQSConsumer")
        .replace(
            'create_client("sqs")',
            f'create_client("sqs", region_name="us-east-1", endpoint_url="{dynamodb_endpoint}")',
        )
        .replace("wait_time=20", "wait_time=0")
        .replace("redis://localhost:6379/0", redis_store_url)
    )
    async with get_session().create_client(
        "sqs", region_name="us-east-1", endpoint_url=dynamodb_endpoint
    ) as sqs:
        queue_url = (await sqs.create_queue(QueueName=f"docs-{uuid.uuid4().hex[:8]}"))["QueueUrl"]

        async def publish() -> None:
            await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"order_id": "o-1"}))

        assert await run_snippet(source, {"queue_url": queue_url}, publish) == ["o-1"]
        await sqs.delete_queue(QueueUrl=queue_url)


async def test_the_redis_streams_snippet(redis_server_url: str) -> None:
    import redis.asyncio

    stream = f"orders-{uuid.uuid4().hex[:8]}"
    source = (
        snippet("RedisStreamConsumer")
        .replace("redis.asyncio.Redis()", f'redis.asyncio.Redis.from_url("{redis_server_url}")')
        .replace('"orders"', f'"{stream}"')
    )
    client = redis.asyncio.Redis.from_url(redis_server_url)

    async def publish() -> None:
        await client.xadd(stream, {"body": json.dumps({"order_id": "o-1"})})

    try:
        assert await run_snippet(source, {}, publish) == ["o-1"]
    finally:
        await client.delete(stream)
        await client.aclose()


async def test_the_rabbitmq_snippet(rabbitmq_url: str) -> None:
    import aio_pika

    queue = f"orders-{uuid.uuid4().hex[:8]}"
    source = (
        snippet("RabbitMQConsumer")
        .replace("amqp://guest:guest@localhost/", rabbitmq_url)
        .replace('"orders"', f'"{queue}"')
        .replace('"orders.dead"', f'"{queue}.dead"')
        # The snippet's own connection, closed by run_snippet.
        .replace(
            "channel = await connection.channel()",
            "opened.append(connection)\nchannel = await connection.channel()",
        )
    )
    connection = await aio_pika.connect(rabbitmq_url)

    async def publish() -> None:
        channel = await connection.channel()
        await channel.declare_queue(
            queue,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.dead"},
        )
        body = json.dumps({"order_id": "o-1"}).encode()
        await channel.default_exchange.publish(
            aio_pika.Message(body, message_id="m-1"), routing_key=queue
        )

    try:
        assert await run_snippet(source, {}, publish) == ["o-1"]
    finally:
        await connection.close()


async def test_the_nats_snippet(nats_url: str) -> None:
    import nats

    stream = f"docs{uuid.uuid4().hex[:8]}"
    source = (
        snippet("JetStreamConsumer")
        .replace("nats://localhost:4222", nats_url)
        .replace('"orders.>"', f'"{stream}.>"')
        # The snippet's own connection, closed by run_snippet.
        .replace("js = (await nats.connect(", "opened.append(await nats.connect(")
        .replace(")).jetstream()", "))\njs = opened[-1].jetstream()")
    )
    connection = await nats.connect(nats_url)
    js = connection.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])

    async def publish() -> None:
        await js.publish(f"{stream}.new", json.dumps({"order_id": "o-1"}).encode())

    try:
        assert await run_snippet(source, {}, publish) == ["o-1"]
    finally:
        await js.delete_stream(stream)
        await connection.close()
