"""``wait`` against an engine that stops answering: with nothing read yet it fails within its
timeout, and once it has read the record it returns that record at its timeout. DynamoDB
hangs behind a proxy that stops forwarding; Redis is a server of the test's own, paused."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, NamedTuple

import pytest

from idemstore import Status, StoreUnavailableError, open_store
from idemstore.testing import FaultProxy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from idemstore import IdempotencyStore, Lease
    from idemstore.local_servers.redis import LocalRedis

FP = "fp-a"
LONG = 60.0


class Hangable(NamedTuple):
    store: IdempotencyStore
    hang: Callable[[], None]  # from now on the engine answers nothing
    says: str  # what the store's unavailable error says


@pytest.fixture
async def hangable_dynamodb(dynamodb_endpoint: str, dynamodb_table: str) -> AsyncIterator[Hangable]:
    # Without a bound of its own, one read inside wait lasted max_attempts read timeouts.
    direct_url = (
        f"dynamodb://{dynamodb_table}?region=us-east-1&endpoint_url={dynamodb_endpoint}"
        "&read_timeout=1&max_attempts=2"
    )
    async with (
        FaultProxy.for_url(direct_url) as proxy,
        open_store(proxy.route(direct_url)) as store,
    ):
        yield Hangable(store, proxy.hang, "did not answer")


@pytest.fixture
async def hangable_redis(own_redis: LocalRedis) -> AsyncIterator[Hangable]:
    # Without a bound of its own, one read inside wait lasted (retries + 1) socket timeouts.
    async with open_store(f"{own_redis.url}?socket_timeout=2&retries=1") as store:
        try:
            yield Hangable(store, own_redis.pause, "did not answer in time")
        finally:
            own_redis.resume()  # before the store closes: a close waits on a paused server


@pytest.fixture(params=["dynamodb", pytest.param("redis", marks=pytest.mark.slow)])
def hangable(request: pytest.FixtureRequest) -> Hangable:
    engine: Hangable = request.getfixturevalue(f"hangable_{request.param}")
    return engine


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


async def acquire(store: IdempotencyStore, key: str) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert reservation.lease is not None
    return reservation.lease


async def test_wait_on_a_hung_engine_fails_within_its_timeout_when_nothing_was_read(
    hangable: Hangable,
) -> None:
    store = hangable.store
    key = new_key()
    await acquire(store, key)
    hangable.hang()
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=hangable.says):
        await store.wait(key, timeout=0.3)
    assert time.monotonic() - started < 1.5


async def test_wait_on_an_engine_that_hangs_meanwhile_returns_the_last_record_at_its_timeout(
    hangable: Hangable,
) -> None:
    store = hangable.store
    key = new_key()
    lease = await acquire(store, key)
    started = time.monotonic()
    waiter = asyncio.create_task(store.wait(key, timeout=1.0))
    await asyncio.sleep(0.3)  # wait has read the record and polls (or has subscribed)
    hangable.hang()
    record = await waiter
    assert time.monotonic() - started < 2.5
    assert record is not None and record.token == lease.token
    assert record.status is Status.IN_PROGRESS
