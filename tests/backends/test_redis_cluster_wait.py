"""``wait_replicas`` on Redis Cluster: each write is followed by ``WAIT`` on the connection that
carried it, to the primary that owns the key's slot, so a write the store acknowledged is on
that primary's replica, also after a ``MOVED`` (a failover the store has not seen) or an
``ASK`` (a slot in migration); a write no replica confirmed fails as on Sentinel; reads never
wait; and a cluster primary without persistence is refused like a Sentinel one.

The whole contract suite on such a cluster passes too (``pytest idemstore/testing/contract
--idemstore-contract "redis+cluster://...?wait_replicas=1"``: 138 tests, about 35 s, as long
as on a cluster without ``wait_replicas``); it is not a fixture variant, which would run every
variant-parametrized test once more in the test command.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ConfigurationError, StoreUnavailableError, open_store
from idemstore.backends.redis.codec import record_key
from idemstore.local_servers.redis import start_redis_cluster
from idemstore.testing.fixtures import require_driver, running

pytest.importorskip("redis", reason="redis-py is not installed: pip install '.[redis]'")

from redis import Redis
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.local_servers.redis import LocalRedis, LocalRedisCluster

# The replicas confirm in milliseconds; the timeout leaves room for a loaded CI machine and
# stays under socket_timeout.
WAIT = "wait_replicas=1&wait_replicas_timeout=3&socket_timeout=5"
KEYS = [f"key-{n}" for n in range(12)]  # enough that every one of the 3 shards gets some


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    """Three primaries with one replica each, all with AOF on."""
    require_driver("redis+cluster", "redis", "redis")
    with running("redis (cluster)", lambda: start_redis_cluster(replicas=1, appendonly=True)) as c:
        yield c


def url_of(cluster: LocalRedisCluster, options: str = WAIT) -> str:
    return f"{cluster.url}?{options}&prefix=t-{uuid.uuid4().hex[:8]}:"


def replicas(cluster: LocalRedisCluster) -> list[LocalRedis]:
    return [node for node in cluster.nodes if cluster.role_of(node) == "slave"]


def names_on(node: LocalRedis, prefix: str) -> list[bytes]:
    with Redis(port=node.port) as client:
        return list(client.scan_iter(match=f"{prefix}*"))


def responses_on(replica: LocalRedis, prefix: str) -> dict[bytes, bytes]:
    """The completed responses ``replica`` holds under ``prefix``, read from the replica."""
    with Redis(port=replica.port, single_connection_client=True) as client:
        client.execute_command("READONLY")
        found = {}
        for name in client.scan_iter(match=f"{prefix}*"):
            with contextlib.suppress(ResponseError):  # a key of another shard: MOVED
                if client.hget(name, "st") == b"c":
                    found[name] = client.hget(name, "res")
        return found


@contextlib.contextmanager
def replicas_paused(cluster: LocalRedisCluster) -> Iterator[None]:
    """Every replica stopped (SIGSTOP), for less than the cluster's node timeout."""
    paused = replicas(cluster)
    for node in paused:
        node.pause()
    try:
        yield
    finally:
        for node in paused:
            node.resume()


async def test_a_write_confirmed_by_wait_is_on_the_replica_of_its_keys_primary(
    cluster: LocalRedisCluster,
) -> None:
    url = url_of(cluster)
    prefix = url.rsplit("prefix=", 1)[1]
    async with open_store(url) as store:
        for key in KEYS:
            reservation = await store.reserve(key, "fp", lease_ttl=10, retention=60)
            assert reservation.lease is not None
            assert await store.complete(reservation.lease, key.encode())
    held = [responses_on(replica, prefix) for replica in replicas(cluster)]
    # Each completion is on exactly one replica (its shard's), with its response; and the
    # keys span every shard, so WAIT ran on each primary, not on one default node.
    assert sorted(response for found in held for response in found.values()) == sorted(
        key.encode() for key in KEYS
    )
    assert all(held), held


async def test_a_write_no_replica_confirms_fails_as_unknown(cluster: LocalRedisCluster) -> None:
    url = url_of(cluster, "wait_replicas=1&wait_replicas_timeout=0.2&socket_timeout=5")
    async with open_store(url) as store:
        with replicas_paused(cluster), pytest.raises(StoreUnavailableError) as refused:
            await store.reserve("unconfirmed", "fp", lease_ttl=10, retention=60)
    assert "only 0 of 1 replicas confirmed it" in str(refused.value)


async def test_reads_do_not_wait_for_replicas(cluster: LocalRedisCluster) -> None:
    async with open_store(url_of(cluster)) as store:
        reservation = await store.reserve("read", "fp", lease_ttl=10, retention=60)
        assert reservation.lease is not None
        with replicas_paused(cluster):
            record = await store.get("read")
    assert record is not None


def slot_of(cluster: LocalRedisCluster, prefix: str, key: str) -> int:
    name = record_key(prefix, "", key).decode()
    return int(cluster.nodes[0].cli("CLUSTER", "KEYSLOT", name))


def primary_of(cluster: LocalRedisCluster, slot: int) -> LocalRedis:
    """The node that serves ``slot`` now, as it says itself."""
    for node in cluster.nodes:
        if cluster.role_of(node) != "master":
            continue
        for line in node.cli("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "myself" not in fields[2]:
                continue
            for served in fields[8:]:
                first, _, last = served.partition("-")
                if not first.startswith("[") and int(first) <= slot <= int(last or first):
                    return node
    raise AssertionError(f"no primary serves slot {slot}")


def fail_over_to(cluster: LocalRedisCluster, promoted: LocalRedis) -> None:
    """A coordinated failover to the replica ``promoted`` (no write is lost); returns once it
    is a primary with its replica linked. Redis drops a manual failover whose handshake with
    the primary does not finish within 5 s (a loaded machine), so it is asked again then."""
    deadline = time.monotonic() + 60
    asked = 0.0
    while cluster.role_of(promoted) != "master" or not cluster.replicas_of(promoted):
        now = time.monotonic()
        assert now < deadline, "the manual failover did not finish"
        if cluster.role_of(promoted) != "master" and now - asked > 6:
            promoted.cli("CLUSTER", "FAILOVER")
            asked = now
        time.sleep(0.05)


async def test_a_write_after_a_failover_follows_moved_and_waits_on_the_new_primary(
    cluster: LocalRedisCluster,
) -> None:
    url = url_of(cluster)
    prefix = url.rsplit("prefix=", 1)[1]
    async with open_store(url) as store:
        # The store learns the slot map now; the failover below makes it stale.
        assert await store.get("moved") is None
        old = primary_of(cluster, slot_of(cluster, prefix, "moved"))
        (promoted,) = cluster.replicas_of(old)
        await asyncio.to_thread(fail_over_to, cluster, promoted)
        # The old primary answers MOVED; the write goes on to the promoted node, whose
        # replica (the old primary) must confirm it.
        reservation = await store.reserve("moved", "fp", lease_ttl=10, retention=60)
        assert reservation.lease is not None
        assert await store.complete(reservation.lease, b"after MOVED")
    assert responses_on(old, prefix) == {record_key(prefix, "", "moved"): b"after MOVED"}


async def test_a_write_to_a_migrating_slot_follows_ask_and_waits_on_the_importing_node(
    cluster: LocalRedisCluster,
) -> None:
    url = url_of(cluster)
    prefix = url.rsplit("prefix=", 1)[1]
    slot = str(slot_of(cluster, prefix, "asked"))
    source = primary_of(cluster, int(slot))
    target = next(n for n in cluster.nodes if n is not source and cluster.role_of(n) == "master")
    target.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", source.cli("CLUSTER", "MYID").strip())
    source.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", target.cli("CLUSTER", "MYID").strip())
    try:
        async with open_store(url) as store:
            # A key the source does not hold is redirected with ASK to the importing node.
            reservation = await store.reserve("asked", "fp", lease_ttl=10, retention=60)
            assert reservation.lease is not None
        # On the importing node and its replica (SCAN: the replica would answer a read of the
        # key with MOVED, the slot being the source's still), not on the source.
        (replica,) = cluster.replicas_of(target)
        name = record_key(prefix, "", "asked")
        assert [name in names_on(node, prefix) for node in (source, target, replica)] == [
            False,
            True,
            True,
        ]
    finally:
        for node in (source, target):
            node.cli("CLUSTER", "SETSLOT", slot, "STABLE")


async def test_a_cluster_primary_without_persistence_is_refused(
    redis_cluster_server_url: str,
) -> None:
    # The session's cluster runs without AOF (and without replicas: the check comes first).
    with pytest.raises(ConfigurationError, match="no persistence"):
        async with open_store(f"{redis_cluster_server_url}?{WAIT}"):
            pass
