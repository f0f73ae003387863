"""Network partitions (``partitions.Network``: namespaces and veths, links taken down).

**PostgreSQL primary cut off from its standby, then promotion.** A primary and a streaming
standby, each in a namespace of its own, replicate over the ``replication`` bridge; the test
process (the clients) reaches both over the ``clients`` bridge, with a store URL listing both
(``target_session_attrs=read-write``). Under load (tasks that reserve and complete new keys):
the primary's replication link goes down; ``CUT`` seconds later the standby is promoted while
the old primary still serves the clients that reach it (split brain); ``CUT`` seconds later
the old primary is cut off from the clients too (as a failover manager fences it), the store
moves to the new primary by itself, and the load goes on. Every acknowledged completion is
then read back from the new primary. Synchronous replication must lose nothing (asserted);
asynchronous loses what the old primary acknowledged after the cut (measured, and asserted to
be exactly the keys that would run again).

**A Redis Cluster primary in the minority** (three primaries with a replica each, every node
in a namespace): the primary is cut off from the rest of the cluster and from the clients
that follow it, while clients beside it still reach it over a second bridge; the majority
promotes its replica after ``cluster-node-timeout``; the link heals and the old primary
rejoins as a replica. ``wait_replicas=1`` must lose nothing (asserted); ``wait_replicas=0``
loses what the cut-off primary acknowledged (measured: lost = would run again, asserted).

**A store cut off from its clients mid-call** (Redis and PostgreSQL in a namespace): the
clients' link goes down for ``CUT`` seconds under load, then comes back. Every call ends in a
result or a typed error within its bound, nothing acknowledged is lost, and the store works
again once the link is back (asserted); time to recover is measured.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.crc import key_slot

from idemstore import IdemstoreError, Status, open_store
from idemstore.backends.redis.codec import record_key
from idemstore.backends.redis.options import DEFAULT_PREFIX
from idemstore.local_servers import free_port
from idemstore.local_servers.postgres import PostgresServer, start_postgres
from idemstore.local_servers.redis import LocalRedis, LocalRedisCluster, _binary
from idemstore.testing.fixtures import require_driver, running
from tests.reliability.partitions import Network

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

pytestmark = pytest.mark.slow

# The test command runs the recommended setting; the campaign both
# (IDEMSTORE_PARTITION_SETTINGS=sync,async).
PG_SETTINGS = (os.environ.get("IDEMSTORE_PARTITION_SETTINGS") or "sync").split(",")
TASKS = 6
# Seconds between the partition's steps: 1.5 in the campaign (IDEMSTORE_PARTITION_CUT), whose
# runs the docs publish; shorter in the test command.
CUT = float(os.environ.get("IDEMSTORE_PARTITION_CUT") or 1.0)
LEASE = 60.0  # longer than the run: a key runs only in the task that reserved it
PG_OPTIONS = "connect_timeout=1&command_timeout=2&pool_max_size=8&auto_migrate=true"
APART_OPTIONS = "connect_timeout=0.5&command_timeout=0.5&pool_max_size=8&auto_migrate=true"
# Connections from the clients' and the replication bridges.
HBA = "host all all 10.0.0.0/8 trust\nhost replication all 10.0.0.0/8 trust\n"


@dataclass
class Load:
    acknowledged: dict[str, bytes] = field(default_factory=dict)
    acknowledged_at: dict[str, float] = field(default_factory=dict)
    typed: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    failures_ended: list[float] = field(default_factory=list)
    longest: float = 0.0


def new_key() -> str:
    return f"k-{uuid.uuid4().hex[:16]}"


async def under_load(
    url: str, steps: Callable[[], Awaitable[dict[str, float]]], keys: Callable[[], str] = new_key
) -> tuple[Load, dict[str, float]]:
    """Tasks reserve and complete new keys (from ``keys``) on ``url`` while ``steps`` runs the
    partition (it returns its moments, ``time.monotonic()`` stamps); then one more ``CUT`` of
    load."""
    load = Load()
    stop = asyncio.Event()
    async with open_store(url) as store:
        await store.get(keys())

        async def worker() -> None:
            while not stop.is_set():
                key = keys()
                started = time.monotonic()
                try:
                    reservation = await store.reserve(key, "fp", lease_ttl=LEASE, retention=600)
                    if reservation.lease is not None and await store.complete(
                        reservation.lease, key.encode()
                    ):
                        load.acknowledged[key] = key.encode()
                        load.acknowledged_at[key] = time.monotonic()
                except IdemstoreError as exc:
                    load.typed.append(type(exc).__name__)
                    load.failures_ended.append(time.monotonic())
                except Exception as exc:  # a driver error that leaked: must be none
                    load.untyped.append(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
                    load.failures_ended.append(time.monotonic())
                load.longest = max(load.longest, time.monotonic() - started)
                if load.failures_ended and load.failures_ended[-1] >= started:
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(worker()) for _ in range(TASKS)]
        await asyncio.sleep(CUT)
        moments = await steps()
        await asyncio.sleep(CUT)
        stop.set()
        await asyncio.gather(*tasks)
    return load, moments


# -- PostgreSQL: the primary cut off from its standby ------------------------------------------


@dataclass
class Pair:
    network: Network
    primary: PostgresServer
    standby: PostgresServer
    synchronous: bool

    @property
    def url(self) -> str:
        hosts = f"{self.primary.host}:{self.primary.port},{self.standby.host}:{self.standby.port}"
        return (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
            f"&schema=idem_partition&{PG_OPTIONS}"
        )


def as_server_user(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True)


@pytest.fixture
def postgres_pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    require_driver("postgres", "asyncpg", "postgres")
    synchronous = request.param == "sync"
    network = Network()
    base = Path(tempfile.mkdtemp(prefix="idemstore-pg-partition-"))
    try:
        p, s = network.node("p"), network.node("s")
        settings = {"synchronous_standby_names": "*"} if synchronous else {}
        with running("postgres", lambda: start_postgres(settings=settings)) as primary:
            primary.stop_process()
            with (primary.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write(HBA)
            primary.namespace, primary.host = p.namespace, p.addresses["clients"]
            primary.settings["listen_addresses"] = ",".join(p.addresses.values())
            primary.start()
            shutil.chown(base, "postgres")
            as_server_user(
                str(primary._bin / "pg_basebackup"),
                *("-D", str(base / "data"), "-R", "-X", "stream", "--no-sync"),
                *("-h", str(primary.socket_dir), "-p", str(primary.port), "-U", "postgres"),
            )
            conf = base / "data" / "postgresql.auto.conf"
            # The standby streams over the replication bridge, not the shared Unix socket.
            socket_host = f"host=''{primary.socket_dir}''"
            assert socket_host in conf.read_text()
            replication = p.addresses["replication"]
            conf.write_text(conf.read_text().replace(socket_host, f"host={replication}"))
            standby = PostgresServer(primary._bin, base, free_port())
            (base / "sock").mkdir()
            shutil.chown(base / "sock", "postgres")
            standby.namespace, standby.host = s.namespace, s.addresses["clients"]
            standby.settings["listen_addresses"] = ",".join(s.addresses.values())
            standby.start()
            try:
                deadline = time.monotonic() + 30
                ready = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                if synchronous:
                    ready += " AND sync_state = 'sync'"
                while primary.sql(ready) in ("", "0"):
                    assert time.monotonic() < deadline, "the standby never streamed"
                    time.sleep(0.1)
                yield Pair(network, primary, standby, synchronous)
            finally:
                # A fast shutdown of a primary cut off from its standby waits for the
                # standby to take its last WAL (30 s, then a kill): crash both instead.
                primary.stop_process(mode="immediate")
                standby.stop_process(mode="immediate")
                standby.stop()
    finally:
        network.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("postgres_pair", PG_SETTINGS, indirect=True)
async def test_a_postgres_primary_cut_off_from_its_standby_then_failed_over(
    postgres_pair: Pair, report_counts: Callable[[dict[str, Any]], None]
) -> None:
    pair = postgres_pair
    p = pair.network.nodes[0]

    async def steps() -> dict[str, float]:
        cut_at = time.monotonic()
        pair.network.cut(p, "replication")
        await asyncio.sleep(CUT)
        promoted_at = time.monotonic()
        await asyncio.to_thread(pair.standby.promote)
        await asyncio.sleep(CUT)
        fenced_at = time.monotonic()
        pair.network.cut(p, "clients")
        return {"cut": cut_at, "promoted": promoted_at, "fenced": fenced_at}

    load, at = await under_load(pair.url, steps)
    new_primary = f"{pair.standby.url}?schema=idem_partition&{PG_OPTIONS}"
    lost = run_again = 0
    lost_between: dict[str, int] = {"cut-promotion": 0, "promotion-fence": 0, "other": 0}
    async with open_store(new_primary) as store:
        for key, response in load.acknowledged.items():
            record = await store.get(key)
            if record is None or record.response != response:
                lost += 1
                when = load.acknowledged_at[key]
                phase = (
                    "cut-promotion"
                    if at["cut"] <= when < at["promoted"]
                    else "promotion-fence"
                    if at["promoted"] <= when < at["fenced"] + 3
                    else "other"
                )
                lost_between[phase] += 1
            if record is None or record.status is not Status.COMPLETED:
                run_again += 1
    after_fence = [t - at["fenced"] for t in load.failures_ended if t >= at["fenced"]]
    acked_after_cut = sum(1 for t in load.acknowledged_at.values() if at["cut"] <= t < at["fenced"])
    counts = {
        "fault": "partition",
        "backend": "postgres",
        "scenario": "primary cut off from its standby, standby promoted, old primary fenced",
        "setting": "synchronous" if pair.synchronous else "asynchronous",
        "acknowledged completions": len(load.acknowledged),
        "acknowledged by the cut-off primary": acked_after_cut,
        "lost": lost,
        "lost acknowledged between the cut and the promotion": lost_between["cut-promotion"],
        "lost acknowledged between the promotion and the fence": lost_between["promotion-fence"],
        "keys that would run again": run_again,
        "typed errors": len(load.typed),
        "error types": sorted(set(load.typed)),
        "untyped errors": len(load.untyped),
        "untyped error examples": load.untyped[:3],
        "recovery seconds": round(max(after_fence, default=0.0), 2),
        "longest call seconds": round(load.longest, 2),
    }
    report_counts(counts)
    assert counts["untyped errors"] == 0, counts
    assert lost_between["other"] == 0, counts
    assert counts["lost"] == counts["keys that would run again"], counts
    if pair.synchronous:
        assert counts["lost"] == 0, counts
    else:
        # The loss is seen: the cut-off primary acknowledged what the standby never got.
        assert counts["lost"] > 0, counts


# -- a store cut off from its clients mid-call -------------------------------------------------


@pytest.fixture
def postgres_apart() -> Iterator[tuple[Network, PostgresServer]]:
    """One PostgreSQL server in a namespace of its own, reached over the clients' bridge."""
    require_driver("postgres", "asyncpg", "postgres")
    network = Network()
    try:
        node = network.node("db")
        with running("postgres", start_postgres) as server:
            server.stop_process()
            with (server.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write(HBA)
            server.namespace, server.host = node.namespace, node.addresses["clients"]
            server.start()
            yield network, server
    finally:
        network.close()


async def test_a_postgres_store_cut_off_from_its_clients_mid_call(
    postgres_apart: tuple[Network, PostgresServer],
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    network, server = postgres_apart
    # Timeouts shorter than the cut, so that the cut is felt (TCP would carry a call that
    # waits longer across it).
    url = f"{server.url}?schema=idem_apart&{APART_OPTIONS}"
    await cut_off_from_its_clients(network, url, "postgres", report_counts)


async def cut_off_from_its_clients(
    network: Network, url: str, backend: str, report_counts: Callable[[dict[str, Any]], None]
) -> None:
    """The one node of ``network`` cut off from its clients for ``CUT`` seconds under load
    on ``url`` (whose connect and call timeouts are 0.5 s), then healed."""

    async def steps() -> dict[str, float]:
        cut_at = time.monotonic()
        network.cut(network.nodes[0], "clients")
        await asyncio.sleep(CUT)
        healed_at = time.monotonic()
        network.heal(network.nodes[0], "clients")
        return {"cut": cut_at, "healed": healed_at}

    load, at = await under_load(url, steps)
    lost = 0
    async with open_store(url) as store:
        for key, response in load.acknowledged.items():
            record = await store.get(key)
            lost += record is None or record.response != response
    after_heal = [t - at["healed"] for t in load.failures_ended if t >= at["healed"]]
    counts = {
        "fault": "partition",
        "backend": backend,
        "setting": f"a single server cut off from its clients for {CUT} s",
        "acknowledged completions": len(load.acknowledged),
        "lost": lost,
        "keys that would run again": lost,
        "typed errors": len(load.typed),
        "error types": sorted(set(load.typed)),
        "untyped errors": len(load.untyped),
        "untyped error examples": load.untyped[:3],
        "recovery seconds": round(max(after_heal, default=0.0), 2),
        "longest call seconds": round(load.longest, 2),
    }
    report_counts(counts)
    assert counts["untyped errors"] == 0, counts
    assert counts["lost"] == 0, counts
    assert counts["typed errors"] > 0, counts  # the cut was felt
    # Every call ended within its bound: a call's timeout plus a connect's, and 2 s of slack.
    assert counts["longest call seconds"] < 0.5 + 0.5 + 2, counts
    # The store came back by itself: calls failed for at most a bound after the link healed.
    assert counts["recovery seconds"] < 0.5 + 0.5 + 2, counts


# Connect and call timeouts shorter than the cut, as APART_OPTIONS; one retry.
REDIS_APART_OPTIONS = "socket_timeout=0.5&socket_connect_timeout=0.5&retries=1"


@pytest.fixture
def redis_apart() -> Iterator[tuple[Network, LocalRedis]]:
    """One Redis server (AOF, fsync always) in a namespace of its own, reached over the
    clients' bridge."""
    require_driver("redis", "redis", "redis")
    network = Network()
    root = Path(tempfile.mkdtemp(prefix="idemstore-redis-apart-"))
    server: LocalRedis | None = None
    try:
        node = network.node("kv")
        server = LocalRedis(
            port=free_port(),
            directory=root,
            appendonly=True,
            appendfsync="always",
            owns_directory=False,
            namespace=node.namespace,
            host=node.addresses["clients"],
        )
        server.start()
        yield network, server
    finally:
        if server is not None:
            server.shutdown(kill=True)
        network.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_redis_store_cut_off_from_its_clients_mid_call(
    redis_apart: tuple[Network, LocalRedis],
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    network, server = redis_apart
    url = f"redis://{server.address}/0?{REDIS_APART_OPTIONS}"
    await cut_off_from_its_clients(network, url, "redis", report_counts)


# -- Redis with Sentinel: the primary cut off from its Sentinels and its replica ---------------

# The test command runs the recommended setting; the campaign both
# (IDEMSTORE_PARTITION_WAIT_REPLICAS=0,1).
SENTINEL_SETTINGS = [
    int(n) for n in (os.environ.get("IDEMSTORE_PARTITION_WAIT_REPLICAS") or "1").split(",")
]
REDIS_OPTIONS = "socket_timeout=1&socket_connect_timeout=0.5&retries=1&wait_replicas_timeout=0.5"


@dataclass
class SentinelGroup:
    network: Network
    primary: LocalRedis
    replica: LocalRedis
    sentinels: list[LocalRedis]

    @property
    def sentinel_url(self) -> str:
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://{hosts}/idem"

    def named_primary(self) -> str:
        answer = self.sentinels[0].cli("SENTINEL", "get-master-addr-by-name", "idem", check=False)
        return ":".join(answer.split())


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    require_driver("redis", "redis", "redis")
    network = Network(root_on=("clients", "replication"))
    root = Path(tempfile.mkdtemp(prefix="idemstore-redis-partition-"))
    nodes: list[LocalRedis] = []

    def node(name: str, **options: Any) -> LocalRedis:
        place = network.node(name)
        (root / name).mkdir()
        server = LocalRedis(
            port=free_port(),
            directory=root / name,
            appendonly=True,
            owns_directory=False,
            namespace=place.namespace,
            host=place.addresses["clients"],
            **options,
        )
        nodes.append(server)
        return server

    try:
        primary = node("p")
        # The clients on the primary's side reach it over the replication bridge.
        primary.also_bind = (network.nodes[0].addresses["replication"],)
        primary.start()
        replica = node("r", replica_of=primary.port, replica_of_host=primary.host)
        replica.start()
        config = (
            f"sentinel monitor idem {primary.host} {primary.port} 2\n"
            "sentinel down-after-milliseconds idem 1000\n"
            "sentinel failover-timeout idem 5000\n"
        )
        sentinels = [node(f"s{i}", sentinel_config=config) for i in range(3)]
        for sentinel in sentinels:
            sentinel.start()
        deadline = time.monotonic() + 30
        while "master_link_status:up" not in replica.cli("INFO", "replication", check=False):
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.1)
        yield SentinelGroup(network, primary, replica, sentinels)
    finally:
        for server in nodes:
            server.shutdown(kill=True)
        network.close()
        shutil.rmtree(root, ignore_errors=True)


async def wait_until(check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not await asyncio.to_thread(check):
        assert time.monotonic() - started < timeout, "timed out"
        await asyncio.sleep(0.1)
    return time.monotonic()


@pytest.mark.parametrize("wait_replicas", SENTINEL_SETTINGS)
async def test_a_redis_primary_cut_off_from_its_sentinels_and_replica(
    sentinel_group: SentinelGroup,
    wait_replicas: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    group = sentinel_group
    p = group.network.nodes[0]
    options = f"{REDIS_OPTIONS}&wait_replicas={wait_replicas}"
    following = f"{group.sentinel_url}?{options}"
    # Clients on the primary's side: they still reach it, and only it, during the partition.
    beside = f"redis://{p.addresses['replication']}:{group.primary.port}/0?{options}"
    replica_address = group.replica.address

    async def steps() -> dict[str, float]:
        cut_at = time.monotonic()
        group.network.cut(p, "clients")
        promoted_at = await wait_until(lambda: group.named_primary() == replica_address, 20)
        await asyncio.sleep(CUT)
        healed_at = time.monotonic()
        group.network.heal(p, "clients")
        demoted = await wait_until(
            lambda: "role:slave" in group.primary.cli("INFO", "replication", check=False), 30
        )
        return {"cut": cut_at, "promoted": promoted_at, "healed": healed_at, "demoted": demoted}

    loads: dict[str, Load] = {}
    moments: dict[str, float] = {}

    async def side(name: str, url: str, run_steps: bool) -> None:
        async def no_steps() -> dict[str, float]:
            await done.wait()
            return {}

        load, at = await under_load(url, steps if run_steps else no_steps)
        loads[name] = load
        moments.update(at)
        if run_steps:
            done.set()

    done = asyncio.Event()
    await asyncio.gather(side("following", following, True), side("beside", beside, False))
    lost: dict[str, int] = {}
    run_again = 0
    async with open_store(following) as store:
        for name, load in loads.items():
            lost[name] = 0
            for key, response in load.acknowledged.items():
                record = await store.get(key)
                if record is None or record.response != response:
                    lost[name] += 1
                if record is None or record.status is not Status.COMPLETED:
                    run_again += 1
    typed = [*loads["following"].typed, *loads["beside"].typed]
    untyped = [*loads["following"].untyped, *loads["beside"].untyped]
    counts = {
        "fault": "partition",
        "backend": "redis-sentinel",
        "setting": f"`wait_replicas={wait_replicas}`",
        "acknowledged completions": sum(len(load.acknowledged) for load in loads.values()),
        "acknowledged by the cut-off primary": sum(
            1
            for load in loads.values()
            for t in load.acknowledged_at.values()
            if moments["cut"] <= t < moments["demoted"] and load is loads["beside"]
        ),
        "lost": sum(lost.values()),
        "lost by clients following Sentinel": lost["following"],
        "lost by clients beside the primary": lost["beside"],
        "keys that would run again": run_again,
        "typed errors": len(typed),
        "error types": sorted(set(typed)),
        "untyped errors": len(untyped),
        "untyped error examples": untyped[:3],
        "promotion seconds": round(moments["promoted"] - moments["cut"], 2),
        "recovery seconds": round(
            max(
                (
                    t - moments["healed"]
                    for t in loads["following"].failures_ended
                    if t >= moments["healed"]
                ),
                default=0.0,
            ),
            2,
        ),
        "longest call seconds": round(max(load.longest for load in loads.values()), 2),
    }
    report_counts(counts)
    assert counts["untyped errors"] == 0, counts
    assert counts["lost"] == counts["keys that would run again"], counts
    if wait_replicas:
        assert counts["lost"] == 0, counts


# -- Redis Cluster: a primary in the minority --------------------------------------------------


@dataclass
class ClusterParts:
    network: Network
    cluster: LocalRedisCluster
    primary: LocalRedis  # the one cut off
    replica: LocalRedis  # its replica, promoted by the majority
    slots: list[tuple[int, int]]  # the cut-off primary's slot ranges

    def owned(self, key: str) -> bool:
        slot = key_slot(record_key(DEFAULT_PREFIX, "", key))
        return any(low <= slot <= high for low, high in self.slots)

    def key_on_primary(self) -> str:
        """A new key whose record lives in the cut-off primary's slots."""
        while not self.owned(key := new_key()):
            pass
        return key


@pytest.fixture
def cluster_parts() -> Iterator[ClusterParts]:
    """Three primaries with one replica each, every node in a namespace of its own. The
    cluster (its bus, its replication, the clients that follow it) uses the clients' bridge;
    each node also listens on the replication bridge, where clients beside a primary reach it
    when the clients' bridge cannot."""
    require_driver("redis", "redis", "redis")
    network = Network(root_on=("clients", "replication"))
    root = Path(tempfile.mkdtemp(prefix="idemstore-redis-cluster-partition-"))
    cluster = LocalRedisCluster(directory=root)
    try:
        for index in range(6):
            place = network.node(f"c{index}")
            (root / f"c{index}").mkdir()
            node = LocalRedis(
                port=free_port(),
                directory=root / f"c{index}",
                appendonly=True,
                cluster=True,
                cluster_port=free_port(),
                owns_directory=False,
                namespace=place.namespace,
                host=place.addresses["clients"],
                also_bind=(place.addresses["replication"],),
            )
            cluster.nodes.append(node)
            node.start()
        created = subprocess.run(
            [_binary("redis-cli"), "--cluster", "create",
             *(node.address for node in cluster.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert created.returncode == 0, created.stdout
        cluster.wait_ok()
        cluster.wait_replicas_linked(1)
        index, primary = next(
            (i, n) for i, n in enumerate(cluster.nodes) if cluster.role_of(n) == "master"
        )
        (replica,) = cluster.replicas_of(primary)
        myself = next(
            line.split()
            for line in primary.cli("CLUSTER", "NODES").splitlines()
            if "myself" in line
        )
        slots = []
        for part in myself[8:]:
            low, _, high = part.partition("-")
            slots.append((int(low), int(high or low)))
        assert index == network.nodes[index].index
        yield ClusterParts(network, cluster, primary, replica, slots)
    finally:
        for node in cluster.nodes:
            node.shutdown(kill=True)
        network.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("wait_replicas", SENTINEL_SETTINGS)
async def test_a_redis_cluster_primary_in_the_minority(
    cluster_parts: ClusterParts,
    wait_replicas: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    parts = cluster_parts
    cluster = parts.cluster
    index = cluster.nodes.index(parts.primary)
    node = parts.network.nodes[index]
    options = f"{REDIS_OPTIONS}&wait_replicas={wait_replicas}"
    following = f"{cluster.url}?{options}"
    # Clients beside the cut-off primary reach it, and only it, over the replication bridge:
    # a plain client on its own slots (a cluster client would follow the others' slot map).
    beside = f"redis://{node.addresses['replication']}:{parts.primary.port}/0?{options}"

    async def steps() -> dict[str, float]:
        cut_at = time.monotonic()
        parts.network.cut(node, "clients")  # the bus, the replication, the followers
        promoted_at = await wait_until(lambda: cluster.role_of(parts.replica) == "master", 30)
        await asyncio.sleep(CUT)
        healed_at = time.monotonic()
        parts.network.heal(node, "clients")
        demoted = await wait_until(lambda: cluster.role_of(parts.primary) == "slave", 30)
        return {"cut": cut_at, "promoted": promoted_at, "healed": healed_at, "demoted": demoted}

    loads: dict[str, Load] = {}
    moments: dict[str, float] = {}
    done = asyncio.Event()

    async def side(name: str, url: str, run_steps: bool) -> None:
        async def no_steps() -> dict[str, float]:
            await done.wait()
            return {}

        load, at = await under_load(url, steps if run_steps else no_steps, parts.key_on_primary)
        loads[name] = load
        moments.update(at)
        if run_steps:
            done.set()

    await asyncio.gather(side("following", following, True), side("beside", beside, False))
    # The old primary has rejoined as a replica: read every acknowledged key back.
    await asyncio.to_thread(cluster.wait_ok)
    lost: dict[str, int] = {}
    run_again = 0
    async with open_store(following) as store:
        for name, load in loads.items():
            lost[name] = 0
            for key, response in load.acknowledged.items():
                record = await store.get(key)
                if record is None or record.response != response:
                    lost[name] += 1
                if record is None or record.status is not Status.COMPLETED:
                    run_again += 1
    typed = [*loads["following"].typed, *loads["beside"].typed]
    untyped = [*loads["following"].untyped, *loads["beside"].untyped]
    following_failures = loads["following"].failures_ended
    counts = {
        "fault": "partition",
        "backend": "redis-cluster",
        "setting": f"`wait_replicas={wait_replicas}`",
        "acknowledged completions": sum(len(load.acknowledged) for load in loads.values()),
        "acknowledged by the cut-off primary": sum(
            1
            for t in loads["beside"].acknowledged_at.values()
            if moments["cut"] <= t < moments["demoted"]
        ),
        # It takes writes until it sees itself in the minority (cluster-node-timeout, 2 s).
        "last acknowledgement by the cut-off primary seconds after the cut": round(
            max(
                (
                    t - moments["cut"]
                    for t in loads["beside"].acknowledged_at.values()
                    if moments["cut"] <= t < moments["healed"]
                ),
                default=0.0,
            ),
            2,
        ),
        # With no replica, the promoted one can confirm no WAIT until the old primary rejoins.
        "acknowledged by the followers between the promotion and the heal": sum(
            1
            for t in loads["following"].acknowledged_at.values()
            if moments["promoted"] <= t < moments["healed"]
        ),
        "lost": sum(lost.values()),
        "lost by clients following the cluster": lost["following"],
        "lost by clients beside the primary": lost["beside"],
        "keys that would run again": run_again,
        "typed errors": len(typed),
        "error types": sorted(set(typed)),
        "untyped errors": len(untyped),
        "untyped error examples": untyped[:3],
        "promotion seconds": round(moments["promoted"] - moments["cut"], 2),
        # The clients following the cluster were served again: their first acknowledgement
        # after the promotion, from the cut (the node timeout, the election and, with
        # wait_replicas, a replica for the promoted one: the old primary, rejoined).
        "followers acknowledged again seconds after the cut": round(
            min(
                (
                    t - moments["cut"]
                    for t in loads["following"].acknowledged_at.values()
                    if t >= moments["promoted"]
                ),
                default=float("nan"),
            ),
            2,
        ),
        # Their last failure, from the cut.
        "followers' last failure seconds after the cut": round(
            max(
                (t - moments["cut"] for t in following_failures if t >= moments["cut"]),
                default=0.0,
            ),
            2,
        ),
        "recovery seconds": round(
            max(
                (t - moments["healed"] for t in following_failures if t >= moments["healed"]),
                default=0.0,
            ),
            2,
        ),
        "rejoined as a replica seconds": round(moments["demoted"] - moments["healed"], 2),
        "longest call seconds": round(max(load.longest for load in loads.values()), 2),
    }
    report_counts(counts)
    assert counts["untyped errors"] == 0, counts
    assert counts["lost"] == counts["keys that would run again"], counts
    if wait_replicas:
        assert counts["lost"] == 0, counts
