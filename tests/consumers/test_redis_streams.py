"""The Redis Streams adapter against a real redis-server (the session's)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Idempotency
from idemstore.consumers import ConsumerDoor, Disposition, Message, body_pointer
from idemstore.consumers.redis_streams import RedisStreamConsumer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow


@pytest.fixture
async def redis(redis_server_url: str) -> AsyncIterator[Any]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_server_url)
    yield client
    await client.aclose()


@pytest.fixture
def stream() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def test_a_duplicate_event_in_two_entries_runs_once_and_both_are_acked(
    store: IdempotencyStore, redis: Any, stream: str
) -> None:
    door = ConsumerDoor(Idempotency(store), key=body_pointer("/event"), busy_delay=0)
    runs: collections.Counter[str] = collections.Counter()

    async def handler(message: Message) -> str:
        runs[message.json()["event"]] += 1
        return "ok"

    consumer = RedisStreamConsumer(
        door, redis, stream, "g", "c1", handler, block=0.05, claim_idle=0.1
    )
    await consumer.ensure_group()
    for event in ["a", "b", "a"]:
        await redis.xadd(stream, {"body": json.dumps({"event": event})})
    seen: list[Disposition] = []
    for _ in range(50):  # a busy entry stays pending until reclaimed
        seen += await consumer.poll_once()
        if (await redis.xpending(stream, "g"))["pending"] == 0:
            break
        await asyncio.sleep(0.05)
    assert runs == {"a": 1, "b": 1}
    assert seen.count(Disposition.PROCESSED) == 2
    assert seen.count(Disposition.REPLAYED) == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_entries_of_a_crashed_consumer_are_reclaimed_and_run_once(
    store: IdempotencyStore, redis: Any, stream: str
) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=0.5))
    runs: list[str] = []

    async def handler(message: Message) -> str:
        runs.append(message.id)
        return "ok"

    live = RedisStreamConsumer(door, redis, stream, "g", "live", handler, block=0.05)
    await live.ensure_group()
    entry = (await redis.xadd(stream, {"body": b"{}"})).decode()
    # A consumer reads the entry and dies before its ack: the entry stays pending on it.
    await redis.xreadgroup("g", "dead", {stream: ">"}, count=1)
    assert await live.poll_once() == []  # not idle long enough yet
    await asyncio.sleep(0.6)
    assert await live.poll_once() == [Disposition.PROCESSED]
    assert runs == [f"{stream}:{entry}"]
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_a_long_handler_keeps_its_entry_from_being_reclaimed(
    store: IdempotencyStore, redis: Any, stream: str
) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=1.0))
    runs: list[str] = []

    async def slow(message: Message) -> str:
        runs.append(message.id)
        await asyncio.sleep(2.5)
        return "ok"

    one = RedisStreamConsumer(door, redis, stream, "g", "one", slow, block=0.05)
    two = RedisStreamConsumer(door, redis, stream, "g", "two", slow, block=0.05)
    await one.ensure_group()
    await redis.xadd(stream, {"body": b"{}"})
    first = asyncio.create_task(one.poll_once())
    seen_by_two: list[Disposition] = []
    while not first.done():
        await asyncio.sleep(0.1)
        seen_by_two += await two.poll_once()
    assert await first == [Disposition.PROCESSED]
    assert seen_by_two == []
    assert len(runs) == 1


async def test_a_dead_lettered_entry_moves_to_the_dead_letter_stream(
    store: IdempotencyStore, redis: Any, stream: str
) -> None:
    door = ConsumerDoor(Idempotency(store), key=body_pointer("/event"))

    async def handler(message: Message) -> str:
        return "ok"

    consumer = RedisStreamConsumer(door, redis, stream, "g", "c", handler, block=0.05)
    await consumer.ensure_group()
    entry = (await redis.xadd(stream, {"body": b"not json"})).decode()
    assert await consumer.poll_once() == [Disposition.DEAD_LETTERED]
    dead = await redis.xrange(f"{stream}.dead")
    assert dead[0][1][b"dead_letter_of"].decode() == entry
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_run_logs_a_failed_read_and_goes_on_until_stopped(
    store: IdempotencyStore,
    redis: Any,
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("idemstore.consumers.door.RETRY_DELAY", 0.05)
    door = ConsumerDoor(Idempotency(store), key=body_pointer("/event"))
    handled: list[str] = []

    async def handler(message: Message) -> str:
        handled.append(message.json()["event"])
        return "ok"

    await redis.set(stream, "not a stream")  # every read fails: WRONGTYPE
    consumer = RedisStreamConsumer(door, redis, stream, "g", "c1", handler, block=0.05)
    running = asyncio.create_task(consumer.run())
    for _ in range(100):
        if any("failed; retrying" in r.getMessage() for r in caplog.records):
            break
        await asyncio.sleep(0.02)
    assert not running.done()
    assert f"reading from {stream} failed; retrying" in caplog.text
    await redis.delete(stream)
    await redis.xadd(stream, {"body": json.dumps({"event": "a"})})
    for _ in range(200):
        if handled:
            break
        await asyncio.sleep(0.02)
    consumer.stop()
    await asyncio.wait_for(running, 5)
    assert handled == ["a"]
