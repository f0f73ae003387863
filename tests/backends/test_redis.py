"""Redis-specific behaviour: the key layout, one script per operation, pub/sub, faults.

The contract suite already runs on Redis and Redis Cluster; these tests cover what only Redis
promises (see docs/backends/redis.md). They use real servers: the session ones from
idemstore/testing/fixtures/redis.py, or dedicated ones when a test stops, pauses or crashes a
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import pytest

from idemstore import (
    ConfigurationError,
    Outcome,
    Status,
    StoreUnavailableError,
    open_store,
)
from idemstore.local_servers import ServerUnavailableError, free_port
from idemstore.testing import FaultProxy
from idemstore.testing.fixtures import running
from tests.conftest import backend_unavailable

pytest.importorskip("redis", reason="redis-py is not installed: pip install '.[redis]'")

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import ReadOnlyError

from idemstore.backends.redis import RedisStore, record_key
from idemstore.backends.redis.scripts import SCRIPTS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from idemstore import IdempotencyStore, Lease
    from idemstore.local_servers.redis import LocalRedis, LocalRedisCluster

LONG = 60.0
FP = "fp"

BOTH = pytest.mark.parametrize("url_fixture", ["redis_store_url", "redis_cluster_store_url"])


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


def nodes_of(url: str) -> list[tuple[str, int]]:
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    return [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in hosts.split(",")]


def prefix_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["prefix"][0]


@pytest.fixture
def url(request: pytest.FixtureRequest, url_fixture: str) -> str:
    """The store URL a test parametrized over ``url_fixture`` (one server, or a cluster) runs on."""
    store_url: str = request.getfixturevalue(url_fixture)
    return store_url


@pytest.fixture
async def admin(url: str) -> AsyncIterator[list[aioredis.Redis]]:
    """A plain client per node of the server behind the test's store URL."""
    clients = [aioredis.Redis(host=h, port=p) for h, p in nodes_of(url)]
    yield clients
    for client in clients:
        await client.aclose()


# Sent by redis-py once per new connection, not per operation.
HANDSHAKE = {"CLIENT", "HELLO", "PING", "CLUSTER", "COMMAND"}


async def sent_commands(nodes: list[aioredis.Redis], operation: Awaitable[Any]) -> list[str]:
    """The commands clients sent to ``nodes`` while ``operation`` ran, as MONITOR saw them:
    not the ones a script ran inside the server, nor connection handshakes."""
    marker = uuid.uuid4().hex
    seen: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        monitors = [await stack.enter_async_context(node.monitor()) for node in nodes]
        await operation
        for node, monitor in zip(nodes, monitors, strict=True):
            await node.echo(marker)
            while True:
                info = await monitor.next_command()
                if marker in info["command"]:
                    break
                name = info["command"].split(" ")[0].upper()
                if info["client_type"] != "lua" and name not in HANDSHAKE:
                    seen.append(name)
    return seen


async def holder(admin: list[aioredis.Redis], url: str, name: bytes) -> aioredis.Redis:
    """The node that holds key ``name`` (KEYS, unlike EXISTS, is never redirected)."""
    for node in admin:
        if name in await node.keys(prefix_of(url) + "*"):
            return node
    raise AssertionError(f"no node holds {name!r}")


# -- the key layout ---------------------------------------------------------------------------


def test_scope_and_key_map_to_distinct_keys_whatever_their_colons() -> None:
    assert record_key("p:", "a:b", "c") != record_key("p:", "a", "b:c")
    assert record_key("p:", "a:b", "c") == b"p:{a%3Ab:c}"
    assert record_key("p:", "a", "b:c") == b"p:{a:b:c}"


def test_braces_in_keys_cannot_end_the_hash_tag() -> None:
    name = record_key("idem:", "{t}", "x}{y%")
    assert name == b"idem:{%7Bt%7D:x%7D%7By%25}"
    assert name.count(b"{") == 1 and name.endswith(b"}")


@BOTH
async def test_a_record_is_one_hash_with_raw_bytes_and_ttl_of_retention_plus_grace(
    url: str, admin: list[aioredis.Redis]
) -> None:
    response = bytes(range(256))
    async with open_store(url, expiry_grace=5) as store:
        lease = (await store.reserve("k", FP, scope="a:b", lease_ttl=LONG, retention=100)).lease
        assert lease is not None
        assert await store.complete(lease, response)
    name = record_key(prefix_of(url), "a:b", "k")
    found = [n for node in admin for n in await node.keys(prefix_of(url) + "*")]
    assert found == [name]
    owner = await holder(admin, url, name)
    assert await owner.type(name) == b"hash"
    assert await owner.hget(name, "res") == response
    assert 100_000 <= await owner.pttl(name) <= 105_002  # (+ 2 ms: codec.key_ttl_ms)


@BOTH
async def test_redis_expires_a_record_by_itself_after_retention_and_lease(
    url: str, admin: list[aioredis.Redis]
) -> None:
    async with open_store(url, expiry_grace=0) as store:
        # A live lease keeps its record alive, so the lease is shorter than the retention.
        lease = (await store.reserve("k", FP, lease_ttl=0.1, retention=0.2)).lease
        assert lease is not None
        await asyncio.sleep(0.5)
    name = record_key(prefix_of(url), "", "k")
    for node in admin:  # KEYS expires what it meets, like any read
        assert await node.keys(prefix_of(url) + "*") == []
    assert name not in {n for node in admin for n in await node.keys("*")}


# -- one round trip per operation -------------------------------------------------------------


@BOTH
async def test_every_operation_is_exactly_one_evalsha(
    url: str, admin: list[aioredis.Redis]
) -> None:
    key = new_key()
    async with open_store(url) as store:
        # Warm up: load every script on the node that owns the key, then start afresh.
        warm = await acquire(store, key)
        await store.extend(warm, lease_ttl=LONG)
        await store.complete(warm, b"x")
        await store.release(warm)
        await store.get(key)
        await store.delete(key)

        one = ["EVALSHA"]
        reservation: list[Any] = []

        async def reserve() -> None:
            reservation.append(await store.reserve(key, FP, lease_ttl=LONG, retention=LONG))

        assert await sent_commands(admin, reserve()) == one
        lease = reservation[-1].lease
        assert lease is not None
        assert await sent_commands(admin, reserve()) == one
        assert reservation[-1].outcome is Outcome.IN_PROGRESS
        assert await sent_commands(admin, store.get(key)) == one
        assert await sent_commands(admin, store.extend(lease, lease_ttl=LONG)) == one
        assert await sent_commands(admin, store.complete(lease, b"done")) == one
        assert await sent_commands(admin, reserve()) == one
        assert reservation[-1].outcome is Outcome.COMPLETED
        assert await sent_commands(admin, store.delete(key)) == one
        lease = await acquire(store, key)
        assert await sent_commands(admin, store.release(lease)) == one


@BOTH
async def test_a_node_without_the_script_runs_it_with_eval(
    url: str, admin: list[aioredis.Redis]
) -> None:
    async with open_store(url) as store:
        await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
        for node in admin:
            await node.script_flush()
        key = new_key()
        used = await sent_commands(admin, store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        assert used == ["EVALSHA", "EVAL"]
        assert (await store.get(key)) is not None
        owner = await holder(admin, url, record_key(prefix_of(url), "", key))
        assert await owner.script_exists(SCRIPTS["reserve"].sha) == [True]


# -- wait -------------------------------------------------------------------------------------


async def pubsub_clients(node: aioredis.Redis) -> int:
    return len(await node.client_list(_type="pubsub"))


@pytest.mark.parametrize("url_fixture", ["redis_store_url"])
async def test_one_pubsub_connection_serves_every_waiter(
    url: str, admin: list[aioredis.Redis]
) -> None:
    (node,) = admin
    before = await pubsub_clients(node)
    async with open_store(url) as store:
        keys = [new_key() for _ in range(20)]
        leases = [await acquire(store, k) for k in keys]
        waits = [asyncio.create_task(store.wait(k, timeout=30)) for k in keys]
        channels = [record_key(prefix_of(url), "", k) for k in keys]
        for _ in range(1000):
            if all(count for _, count in await node.pubsub_numsub(*channels)):
                break
            await asyncio.sleep(0.01)
        assert await pubsub_clients(node) == before + 1
        for lease in leases:
            assert await store.complete(lease, b"done")
        records = await asyncio.gather(*waits)
        assert all(r is not None and r.status is Status.COMPLETED for r in records)
    # The server drops a closed client when it reads the close, a moment after close returns
    # (a loaded CI machine still listed it once): give it that moment, not a fixed sleep.
    for _ in range(200):
        if await pubsub_clients(node) == before:
            break
        await asyncio.sleep(0.01)
    assert await pubsub_clients(node) == before


async def data_clients(node: aioredis.Redis) -> int:
    return len(await node.client_list(_type="normal"))


@pytest.mark.parametrize("url_fixture", ["redis_store_url"])
async def test_a_store_keeps_no_more_connections_than_calls_in_flight_and_closes_them(
    url: str, admin: list[aioredis.Redis]
) -> None:
    (node,) = admin
    before = await data_clients(node)
    async with open_store(url, max_connections=4) as store:
        await asyncio.gather(
            *(store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG) for _ in range(40))
        )
        # At most one per call in flight, and the pool's one that entering pinged on.
        assert 1 <= await data_clients(node) - before <= 4 + 1
    for _ in range(200):  # the server drops a closed client a moment after close returns
        if await data_clients(node) == before:
            break
        await asyncio.sleep(0.01)
    assert await data_clients(node) == before


@BOTH
async def test_wait_still_returns_when_the_pubsub_connection_is_killed(
    url: str, admin: list[aioredis.Redis]
) -> None:
    async with open_store(url) as store:
        key = new_key()
        lease = await acquire(store, key)
        waiter = asyncio.create_task(store.wait(key, timeout=30))
        await asyncio.sleep(0.2)
        for node in admin:
            await node.client_kill_filter(_type="pubsub")
        assert await store.complete(lease, b"done")
        record = await asyncio.wait_for(waiter, 10)
        assert record is not None and record.status is Status.COMPLETED


@BOTH
async def test_waits_end_typed_while_pubsub_connections_are_killed_under_them(
    url: str, admin: list[aioredis.Redis]
) -> None:
    # Waiters keep subscribing while the server drops the shared pub/sub connection: the
    # reader's reconnect must never pull the connection out from under a subscriber's send
    # (redis-py then raised AttributeError from inside the send, out of wait).
    untyped: list[BaseException] = []
    finished = 0

    async def waiter(store: Any) -> None:
        nonlocal finished
        key = new_key()
        await acquire(store, key)
        try:
            await store.wait(key, timeout=0.05)
        except StoreUnavailableError:
            pass
        except Exception as exc:
            untyped.append(exc)
        finished += 1

    async def killer(stop: asyncio.Event) -> None:
        while not stop.is_set():
            for node in admin:
                with contextlib.suppress(Exception):
                    await node.client_kill_filter(_type="pubsub")
            await asyncio.sleep(0.005)

    async with open_store(url) as store:
        stop = asyncio.Event()
        kills = asyncio.create_task(killer(stop))
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and not untyped:
                await asyncio.gather(*(waiter(store) for _ in range(32)))
        finally:
            stop.set()
            await kills
    assert finished > 0
    assert untyped == []


# -- concurrency ------------------------------------------------------------------------------


async def acquire(store: Any, key: str, *, lease_ttl: float = LONG) -> Any:
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED
    return reservation.lease


@BOTH
async def test_concurrent_takeovers_of_a_lapsed_lease_acquire_once(url: str) -> None:
    stores = [open_store(url) for _ in range(4)]
    try:
        key = new_key()
        first = await acquire(stores[0], key, lease_ttl=0.2)
        await asyncio.sleep(0.4)
        results = await asyncio.gather(
            *(
                store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
                for store in stores
                for _ in range(25)
            )
        )
        winners = [r for r in results if r.outcome is Outcome.ACQUIRED]
        assert len(winners) == 1
        assert winners[0].takeover and winners[0].lease is not None
        assert winners[0].lease.fence == first.fence + 1
        assert await stores[1].complete(first, b"stale") is False
    finally:
        for store in stores:
            await store.close()


# -- redis-py's retries of scripts that had run -----------------------------------------------


@pytest.fixture
async def dropper(redis_server_url: str) -> AsyncIterator[tuple[FaultProxy, IdempotencyStore]]:
    """A reply-dropping proxy and a store through it, with every script already loaded (else
    the dropped reply would be EVALSHA's NOSCRIPT, not the script's own answer)."""
    ((_, port),) = nodes_of(redis_server_url)
    client = aioredis.Redis(port=port)
    for script in SCRIPTS.values():
        await client.script_load(script.source)
    await client.aclose()
    async with FaultProxy("127.0.0.1", port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?prefix=t-{uuid.uuid4().hex[:12]}:"
        async with open_store(url) as store:
            yield proxy, store


async def test_a_first_reserve_whose_reply_was_lost_and_retried_acquires_once(
    dropper: tuple[FaultProxy, IdempotencyStore],
) -> None:
    # The first run took the script's fresh-key branch; the driver's retry finds its own
    # token and must answer as that first run did, with the same lease.
    proxy, store = dropper
    key = new_key()
    proxy.drop_next_reply(containing=key.encode())
    reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert proxy.counts["replies dropped"] == 1
    assert reservation.outcome is Outcome.ACQUIRED and not reservation.takeover
    lease = reservation.lease
    assert lease is not None and lease.fence == 1
    record = await store.get(key)
    assert record is not None and record.token == lease.token
    assert record.lease_expires_at == lease.lease_expires_at
    assert await store.complete(lease, b"result") is True


async def test_a_first_reserve_returns_the_lease_deadline_the_server_stored(
    redis_store_url: str,
) -> None:
    async with open_store(redis_store_url) as store:
        reservation = await store.reserve(new_key(), FP, lease_ttl=12.345678, retention=LONG)
        lease = reservation.lease
        assert lease is not None and lease.fence == 1 and not reservation.takeover
        record = await store.get(lease.key)
        assert record is not None and record.lease_expires_at == lease.lease_expires_at
        assert record.created_at + 12.345678 == pytest.approx(lease.lease_expires_at, abs=1e-6)


async def test_a_resent_release_reports_success_after_the_key_was_acquired_again(
    redis_store_url: str,
) -> None:
    # Found by the network-fault history: a release ran, its reply was lost, a waiter took
    # the tombstone at once, and the driver's resend (same nonce) was told "not yours", so
    # the releaser logged a release that never happened. The resend is played here exactly
    # as redis-py sends it: the same script, key and arguments, nonce included.
    async with open_store(redis_store_url) as store:
        assert isinstance(store, RedisStore)
        key = new_key()
        first = await acquire(store, key)
        name = record_key(prefix_of(redis_store_url), "", key)
        args = (first.token, str(first.fence), "nonce-" + uuid.uuid4().hex)
        ((_, port),) = nodes_of(redis_store_url)
        client = aioredis.Redis(port=port)
        try:
            release = SCRIPTS["release"].source
            assert await client.eval(release, 1, name, *args) == 1
            again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
            assert again.lease is not None and again.lease.fence == 2 and not again.takeover
            assert await client.eval(release, 1, name, *args) == 1  # the resend
            # Any other call on the old lease still owns nothing, and the new holder holds.
            assert await store.release(first) is False
            assert await store.complete(again.lease, b"done") is True
        finally:
            await client.aclose()


# An ending call, and the response its key keeps once it ran (release keeps no record).
ENDINGS: dict[str, tuple[Callable[[IdempotencyStore, Lease], Awaitable[bool]], bytes | None]] = {
    "complete": (lambda store, lease: store.complete(lease, b"result"), b"result"),
    "release": (lambda store, lease: store.release(lease), None),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_complete_or_release_whose_reply_was_lost_and_retried_reports_success(
    dropper: tuple[FaultProxy, IdempotencyStore], ending: str
) -> None:
    proxy, store = dropper
    end, kept = ENDINGS[ending]
    key = new_key()
    lease = await acquire(store, key)
    proxy.drop_next_reply(containing=lease.token.encode())
    assert await end(store, lease) is True
    assert proxy.counts["replies dropped"] == 1
    record = await store.get(key)
    assert (None if record is None else record.response) == kept
    assert await end(store, lease) is False  # a second call is refused


# -- close ------------------------------------------------------------------------------------


async def test_close_during_the_first_cluster_connect_fails_the_operation_and_keeps_no_client(
    redis_cluster_server_url: str,
) -> None:
    (_, port), *_ = nodes_of(redis_cluster_server_url)
    async with FaultProxy("127.0.0.1", port) as proxy:
        proxy.hang()
        store = RedisStore.from_url(
            f"redis+cluster://127.0.0.1:{proxy.port}/?prefix=t-{uuid.uuid4().hex[:12]}:"
        )
        key = new_key()
        operation = asyncio.create_task(store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        await asyncio.sleep(0.2)  # the operation waits for the cluster's first answer
        await store.close()
        proxy.resume()
        with pytest.raises(RuntimeError, match="closed"):
            await operation
        assert store._connection is None


# -- deadlines out of range -------------------------------------------------------------------

# Past 2^53 microseconds (the year 2255) a Lua number no longer holds every integer, and from
# 1e17 on Redis writes it in scientific notation: 1e11 s lands there, 1e15 s also overflows
# PEXPIREAT's integer argument.
TOO_LONG = pytest.mark.parametrize("seconds", [1e11, 1e15])


@pytest.fixture
async def store(redis_store_url: str) -> AsyncIterator[IdempotencyStore]:
    async with open_store(redis_store_url) as opened:
        yield opened


class Raw(NamedTuple):
    """A plain client to the server behind ``url``, beside the store."""

    client: aioredis.Redis
    url: str

    def name(self, key: str) -> bytes:
        """The Redis key of ``key``'s record."""
        return record_key(prefix_of(self.url), "", key)


@pytest.fixture
async def raw(redis_store_url: str) -> AsyncIterator[Raw]:
    ((host, port),) = nodes_of(redis_store_url)
    client = aioredis.Redis(host=host, port=port)
    yield Raw(client, redis_store_url)
    await client.aclose()


@TOO_LONG
async def test_reserve_with_a_retention_past_2_53_us_is_refused_and_writes_nothing(
    store: IdempotencyStore, raw: Raw, seconds: float
) -> None:
    key = new_key()
    with pytest.raises(ConfigurationError, match="retention"):
        await store.reserve(key, FP, lease_ttl=LONG, retention=seconds)
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        await store.reserve(key, FP, lease_ttl=seconds, retention=LONG)
    assert await raw.client.exists(raw.name(key)) == 0
    lease = await acquire(store, key)
    assert lease.fence == 1


@TOO_LONG
async def test_complete_or_extend_past_2_53_us_is_refused_and_leaves_the_lease_held(
    store: IdempotencyStore, raw: Raw, seconds: float
) -> None:
    key = new_key()
    lease = await acquire(store, key)
    with pytest.raises(ConfigurationError, match="retention"):
        await store.complete(lease, b"late", retention=seconds)
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        await store.extend(lease, lease_ttl=seconds)
    record = await store.get(key)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.expires_at < time.time() + 2 * LONG
    assert await raw.client.pttl(raw.name(key)) > 0
    assert await store.complete(lease, b"done")


async def test_a_record_whose_deadlines_are_in_scientific_notation_still_reads(
    store: IdempotencyStore, raw: Raw
) -> None:
    # What an earlier version wrote for a retention of 1e11 s: the deadline is a Lua number
    # past 1e17, which Redis writes as a float.
    key = new_key()
    await raw.client.hset(
        raw.name(key),
        mapping={
            "st": "c",
            "fp": FP,
            "tok": "t" * 32,
            "fen": "1",
            "ca": str(int(time.time() * 1e6)),
            "ea": "1.0179597400393685e+17",
            "res": b"kept",
            "tk": "0",
        },
    )
    record = await store.get(key)
    assert record is not None and record.response == b"kept"
    assert record.expires_at == pytest.approx(1.0179597400393685e11)
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.COMPLETED


# -- argument checks --------------------------------------------------------------------------

BAD_LIMITS = pytest.mark.parametrize("limit", [0, -1, True, 2.5, "5", None])
BAD_TIMEOUTS = pytest.mark.parametrize("timeout", [float("nan"), -1, -0.5, True, "1", None])


@BAD_LIMITS
async def test_sweep_rejects_a_limit_that_is_not_a_positive_int(
    redis_store_url: str, limit: Any
) -> None:
    async with open_store(redis_store_url) as store:
        with pytest.raises(ConfigurationError, match="limit"):
            await store.sweep(limit=limit)


@BAD_TIMEOUTS
async def test_wait_rejects_a_timeout_that_is_not_a_non_negative_number(
    redis_store_url: str, timeout: Any
) -> None:
    async with open_store(redis_store_url) as store:
        await acquire(store, key := new_key())
        with pytest.raises(ConfigurationError, match="timeout"):
            await store.wait(key, timeout=timeout)


async def test_wait_with_a_zero_timeout_returns_the_current_record(redis_store_url: str) -> None:
    async with open_store(redis_store_url) as store:
        lease = await acquire(store, key := new_key())
        record = await store.wait(key, timeout=0)
        assert record is not None and record.token == lease.token


# -- configuration ----------------------------------------------------------------------------


def test_cluster_url_names_every_startup_node() -> None:
    store = RedisStore.from_url("redis+cluster://a:7000,b:7001,[::1]:7002/?prefix=x:")
    assert store._nodes == [("a", 7000), ("b", 7001), ("::1", 7002)]
    assert store._cluster


def test_rediss_url_builds_a_tls_client_without_connecting() -> None:
    store = RedisStore.from_url(
        "rediss://user:s3cret@cache.example:6380/2?ssl_cert_reqs=none&ssl_check_hostname=false"
    )
    client = store._new_client()
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is SSLConnection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.example", 6380, 2)
    assert (kwargs["username"], kwargs["password"]) == ("user", "s3cret")
    assert kwargs["ssl_cert_reqs"] == "none" and kwargs["ssl_check_hostname"] is False


# -- faults -----------------------------------------------------------------------------------


def test_a_local_server_starts_in_a_directory_given_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemstore.local_servers.redis import start_redis

    monkeypatch.chdir(tmp_path)
    try:
        server = start_redis(directory=Path("data"), appendonly=True)
    except ServerUnavailableError as exc:
        if "not on PATH" in str(exc):
            backend_unavailable("redis", str(exc))
        raise
    try:
        assert server.cli("PING").strip() == "PONG"
        assert (tmp_path / "data" / "redis.log").exists()
    finally:
        server.stop()


async def test_an_unreachable_server_is_store_unavailable_without_the_password() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0?retries=1&socket_connect_timeout=1"
    store = open_store(url)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
    assert caught.value.__cause__ is not None
    assert "hunter2" not in str(caught.value)
    await store.close()


PASSWORD = "s3cret-Pa55"


@pytest.fixture
def password_redis() -> Iterator[LocalRedis]:
    """A server of this test's own that requires ``PASSWORD`` (its ``url`` gives none)."""
    from idemstore.local_servers.redis import start_redis

    with running("redis", lambda: start_redis(requirepass=PASSWORD)) as server:
        yield server


def with_userinfo(url: str, userinfo: str) -> str:
    return url.replace("redis://", f"redis://{userinfo}@", 1)


async def test_a_server_requiring_a_password_the_url_lacks_says_where_it_goes(
    password_redis: LocalRedis,
) -> None:
    store = open_store(password_redis.url)
    with pytest.raises(ConfigurationError, match="requires a password") as caught:
        await store.get(new_key())
    assert "redis://:PASSWORD@HOST:PORT/0" in str(caught.value)
    assert "HELLO" not in str(caught.value)
    await store.close()


async def test_entering_a_store_without_the_password_a_server_requires_fails_the_same_way(
    password_redis: LocalRedis,
) -> None:
    with pytest.raises(ConfigurationError, match="requires a password"):
        async with open_store(password_redis.url):
            pass


@pytest.mark.parametrize("userinfo", [":n0t-it", "default:n0t-it", "nobody:n0t-it"])
async def test_a_wrong_user_or_password_is_refused_without_showing_the_password(
    password_redis: LocalRedis, userinfo: str
) -> None:
    store = open_store(with_userinfo(password_redis.url, userinfo))
    with pytest.raises(ConfigurationError, match="refused the user and password") as caught:
        await store.get(new_key())
    assert "n0t-it" not in str(caught.value)
    await store.close()


async def test_the_password_a_server_requires_is_given_in_the_url(
    password_redis: LocalRedis,
) -> None:
    async with open_store(with_userinfo(password_redis.url, f":{PASSWORD}")) as store:
        assert await acquire(store, new_key())


@pytest.mark.slow
async def test_a_hung_server_is_store_unavailable_within_operation_timeout(
    own_redis: LocalRedis,
) -> None:
    url = f"{own_redis.url}?socket_timeout=0.2&operation_timeout=1&retries=1"
    async with open_store(url) as store:
        own_redis.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
            with pytest.raises(StoreUnavailableError):
                await store.wait(new_key(), timeout=30)
            assert time.monotonic() - started < 5
        finally:
            own_redis.resume()
        await store.ping()


@BOTH
async def test_a_call_starts_no_task_of_its_own(url: str) -> None:
    # Given a socket_timeout, redis-py sends every command under asyncio.wait_for, which on
    # Python 3.11 runs the send as a task of its own: the store bounds its attempts itself.
    loop = asyncio.get_running_loop()
    started: list[object] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        started.append(coro)
        return asyncio.Task(coro, loop=loop, **options)

    async with open_store(url) as store:
        await acquire(store, new_key())  # connected, scripts loaded
        previous = loop.get_task_factory()
        loop.set_task_factory(counting)
        try:
            for _ in range(10):
                lease = await acquire(store, new_key())
                assert await store.complete(lease, b"done")
                assert await store.get(lease.key) is not None
        finally:
            loop.set_task_factory(previous)
    assert started == []


@pytest.mark.slow
async def test_a_reply_late_for_one_attempt_is_retried_and_the_key_acquired_once(
    own_redis: LocalRedis,
) -> None:
    # The server stalls past the first attempt's socket_timeout but not past every attempt:
    # the call is slow, not failed, and the retry is answered as the first attempt (same
    # token), which the server ran once it woke.
    async with (
        open_store(f"{own_redis.url}?socket_timeout=0.3&retries=3") as store,
        open_store(own_redis.url) as other,
    ):
        key = new_key()
        own_redis.pause()
        asyncio.get_running_loop().call_later(0.5, own_redis.resume)
        started = time.monotonic()
        try:
            reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        finally:
            own_redis.resume()
        assert time.monotonic() - started >= 0.3
        assert reservation.outcome is Outcome.ACQUIRED
        assert reservation.lease is not None and reservation.lease.fence == 1
        seen = await other.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert seen.outcome is Outcome.IN_PROGRESS
        assert seen.record is not None and seen.record.token == reservation.lease.token


@pytest.mark.slow
async def test_a_hung_server_fails_a_call_once_every_attempt_has_run_out_of_time(
    own_redis: LocalRedis,
) -> None:
    async with open_store(f"{own_redis.url}?socket_timeout=0.3&retries=1") as store:
        await store.get(new_key())  # connected
        own_redis.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="did not answer in time"):
                await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
            took = time.monotonic() - started
        finally:
            own_redis.resume()
        # Two attempts of 0.3 s (retries=1), then the error: not one, and not unbounded.
        assert 0.6 <= took < 3


@pytest.mark.slow
async def test_the_store_recovers_when_the_server_comes_back(own_redis: LocalRedis) -> None:
    async with open_store(f"{own_redis.url}?retries=1&socket_timeout=1") as store:
        key = new_key()
        await acquire(store, key)
        own_redis.shutdown()
        with pytest.raises(StoreUnavailableError):
            await store.get(key)
        own_redis.start()
        record = await store.get(key)
        assert record is not None and record.status is Status.IN_PROGRESS


@pytest.mark.slow
async def test_acknowledged_writes_survive_a_crash_with_appendfsync_always(
    own_redis: LocalRedis,
) -> None:
    done, held, released = new_key(), new_key(), new_key()
    async with open_store(own_redis.url) as store:
        lease = await acquire(store, done)
        assert await store.complete(lease, b"\x00paid")
        holder = await acquire(store, held)
        gone = await acquire(store, released)
        assert await store.release(gone)
    own_redis.restart(kill=True)  # SIGKILL: no chance to flush anything at shutdown
    async with open_store(own_redis.url) as store:
        record = await store.get(done)
        assert record is not None and record.response == b"\x00paid"
        again = await store.reserve(held, FP, lease_ttl=LONG, retention=LONG)
        assert again.outcome is Outcome.IN_PROGRESS
        assert again.record is not None and again.record.token == holder.token
        fresh = await acquire(store, released)
        assert fresh.fence == gone.fence + 1


@pytest.mark.slow
async def test_a_read_only_replica_is_store_unavailable_for_writes(
    own_redis: LocalRedis,
) -> None:
    from idemstore.local_servers.redis import start_redis

    replica = start_redis()
    try:
        replica.cli("REPLICAOF", "127.0.0.1", str(own_redis.port))
        async with open_store(f"{replica.url}?retries=0") as store:
            with pytest.raises(StoreUnavailableError) as caught:
                await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
            assert isinstance(caught.value.__cause__, ReadOnlyError)
            assert "read only replica" in str(caught.value)
    finally:
        replica.stop()


# -- Redis Cluster ----------------------------------------------------------------------------


@pytest.mark.parametrize("url_fixture", ["redis_cluster_store_url"])
async def test_cluster_spreads_records_over_every_node(
    url: str, admin: list[aioredis.Redis]
) -> None:
    async with open_store(url) as store:
        for _ in range(40):
            lease = await acquire(store, new_key())
            assert await store.complete(lease, b"ok")
    per_node = [len(await node.keys(prefix_of(url) + "*")) for node in admin]
    assert sum(per_node) == 40
    assert all(count > 0 for count in per_node)


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[LocalRedisCluster]:
    """A cluster for tests that stop nodes or move slots; a stopped node keeps its data."""
    from idemstore.local_servers.redis import start_redis_cluster

    with running("redis+cluster", lambda: start_redis_cluster(appendonly=True)) as cluster:
        yield cluster


def owner_of(cluster: LocalRedisCluster, name: bytes) -> LocalRedis:
    slot = cluster.nodes[0].cli("CLUSTER", "KEYSLOT", name.decode()).strip()
    for node in cluster.nodes:
        if node.cli("CLUSTER", "COUNTKEYSINSLOT", slot).strip() != "0":
            return node
    raise AssertionError(f"no node holds {name!r}")


class Held(NamedTuple):
    store: IdempotencyStore
    key: str
    lease: Lease
    name: bytes  # the key's record
    owner: LocalRedis  # the node that holds it


@contextlib.asynccontextmanager
async def held_on(cluster: LocalRedisCluster, options: str = "") -> AsyncIterator[Held]:
    """A store on ``cluster`` (a prefix of its own, then ``options``) holding a fresh key."""
    url = f"{cluster.url}?prefix=c-{uuid.uuid4().hex[:8]}:{options}"
    async with open_store(url) as store:
        key = new_key()
        name = record_key(prefix_of(url), "", key)
        yield Held(store, key, await acquire(store, key), name, owner_of(cluster, name))


@pytest.mark.slow
async def test_cluster_follows_a_slot_moved_to_another_node(
    own_cluster: LocalRedisCluster,
) -> None:
    async with held_on(own_cluster) as (store, key, lease, name, source):
        target = next(node for node in own_cluster.nodes if node is not source)
        slot = source.cli("CLUSTER", "KEYSLOT", name.decode()).strip()
        source_id = source.cli("CLUSTER", "MYID").strip()
        target_id = target.cli("CLUSTER", "MYID").strip()
        target.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        source.cli("MIGRATE", "127.0.0.1", str(target.port), name.decode(), "0", "5000")
        for node in own_cluster.nodes:
            node.cli("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        # The store's slot map is stale now: it must follow the MOVED reply.
        assert await store.complete(lease, b"after the move")
        record = await store.get(key)
        assert record is not None and record.response == b"after the move"
        assert owner_of(own_cluster, name) is target


@pytest.mark.slow
async def test_a_cluster_node_down_is_store_unavailable_then_recovers(
    own_cluster: LocalRedisCluster,
) -> None:
    async with held_on(own_cluster, "&retries=2&operation_timeout=3") as (
        store,
        _,
        lease,
        _,
        victim,
    ):
        victim.shutdown()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.complete(lease, b"while down")
            assert time.monotonic() - started < 10
        finally:
            victim.start()
            own_cluster.wait_ok()
        deadline = time.monotonic() + 20
        while True:
            try:
                assert await store.complete(lease, b"after")
                break
            except StoreUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


def test_the_wheel_ships_every_lua_script(built_wheel: Path) -> None:
    """The scripts are package data read with importlib.resources: an installed store needs
    them in the wheel, not in the checkout."""
    import zipfile

    from idemstore.backends.redis import scripts

    with zipfile.ZipFile(built_wheel) as wheel:
        shipped = {name for name in wheel.namelist() if name.endswith(".lua")}
    parts = {"prelude", *(part for parts in scripts._PARTS.values() for part in parts)}
    assert shipped == {f"idemstore/backends/redis/lua/{part}.lua" for part in parts}


# -- issue 15: wake-ups stay on the key's shard ---------------------------------------------


async def announced(nodes: list[aioredis.Redis]) -> dict[str, int]:
    """PUBLISH and SPUBLISH calls over every node so far, scripts' calls included."""
    totals = {"publish": 0, "spublish": 0}
    for node in nodes:
        stats = await node.info("commandstats")
        for name in totals:
            totals[name] += int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
    return totals


@pytest.mark.parametrize("url_fixture", ["redis_cluster_store_url"])
async def test_a_cluster_complete_spublishes_on_its_shard_and_wakes_the_wait(
    url: str, admin: list[aioredis.Redis]
) -> None:
    """A PUBLISH on a cluster is broadcast to every node; SPUBLISH (Redis 7) stays on the
    shard that owns the key, where the waiting store subscribed with SSUBSCRIBE."""
    async with open_store(url) as store:
        for key in ("a", "b", "c"):  # keys on different shards, most likely
            lease = await acquire(store, key)
            waiting = asyncio.ensure_future(store.wait(key, timeout=30))
            await asyncio.sleep(0.1)  # subscribed and asleep
            before = await announced(admin)
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await store.complete(lease, b"ok")
            record = await asyncio.wait_for(waiting, 5)
            assert loop.time() - started < 0.5  # pushed, not found by a periodic re-read
            assert record is not None and record.response == b"ok"
            after = await announced(admin)
            assert after["spublish"] - before["spublish"] == 1
            assert after["publish"] == before["publish"]


def test_sharded_pub_sub_needs_redis_7_on_every_node() -> None:
    from idemstore.backends.redis.notifier import shard_pubsub_in_all

    assert shard_pubsub_in_all(["7.0.15", "7.2.4", "8.0.0"])
    assert not shard_pubsub_in_all(["7.0.15", "6.2.14"])
    assert not shard_pubsub_in_all(["unknown"])
    assert shard_pubsub_in_all([])
