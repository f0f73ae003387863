"""``wait_replicas`` on Redis Cluster: each write is followed by ``WAIT`` on the connection that
carried it, to the primary that owns the key's slot, so a write the store acknowledged is on
that primary's replica; a write no replica confirmed fails as on Sentinel; reads never wait;
and a cluster primary without persistence is refused like a Sentinel one.

The contract suite on such a cluster is run by hand (about 35 s, as long as on a cluster
without replicas; see docs/backends/redis.md), not in the test command.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ConfigurationError, StoreUnavailableError, open_store
from idemstore.local_servers.redis import start_redis_cluster
from idemstore.testing.fixtures import require_driver, running

pytest.importorskip("redis", reason="redis-py is not installed: pip install 'idemstore[redis]'")

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


async def test_a_cluster_primary_without_persistence_is_refused(
    redis_cluster_server_url: str,
) -> None:
    # The session's cluster runs without AOF (and without replicas: the check comes first).
    with pytest.raises(ConfigurationError, match="no persistence"):
        async with open_store(f"{redis_cluster_server_url}?{WAIT}"):
            pass
