"""Failover on PostgreSQL and Redis Cluster: a primary dies under load, a replica is promoted,
and we count acknowledged completions lost, keys that would run again, errors, and how long
the store took to work again. Measured as in ``test_redis_sentinel``.

- **PostgreSQL**: a primary and a streaming standby (``pg_basebackup -R``). The primary is
  stopped in ``immediate`` mode (a crash: no checkpoint, no goodbye to the standby) and the
  standby promoted with ``pg_ctl promote``. The store's URL lists both hosts with
  ``target_session_attrs=read-write``, so new connections find whichever is the primary. With
  ``synchronous_standby_names = '*'`` (``synchronous_commit = on``) a commit returns only once
  the standby has flushed it: nothing acknowledged may be lost. Without it the standby may
  miss the last commits.
- **Redis Cluster**: three primaries with one replica each; one primary is SIGKILLed and the
  cluster promotes its replica after the node timeout; the old primary is then started again
  and rejoins as a replica. Replication is asynchronous: without ``wait_replicas`` the loss is
  measured, not asserted; with ``wait_replicas=1`` (the store sends ``WAIT`` on the key's
  primary, every node with AOF) nothing acknowledged may be lost.

Counted per run: ``lost after failover`` (an acknowledged completion whose record is missing
or has another response), ``keys that would run again`` (no completed record: a retry runs
the operation again, at once or once its lease lapses), ``typed errors`` (``IdemstoreError``),
``untyped errors`` (anything else: must be 0), ``recovery seconds`` (from the kill to the end
of the last call that failed; calls after it all succeeded) and ``longest call``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import IdemstoreError, Status, open_store
from idemstore.local_servers.postgres import start_postgres, start_streaming_replica
from idemstore.local_servers.redis import start_redis_cluster
from idemstore.testing.faults import FaultProxy
from idemstore.testing.fixtures import require_driver, running

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from idemstore.local_servers.postgres import PostgresServer
    from idemstore.local_servers.redis import LocalRedisCluster

TASKS = 6
BEFORE = 1.5  # seconds of load before the primary dies
AFTER = 1.5  # seconds of load once the new primary took over
CUT_OFF = 1.0  # seconds the standby hears nothing from the primary before the crash
LEASE = 30.0  # longer than the run: a key is executed only by the task that reserved it
PG_OPTIONS = "connect_timeout=1&command_timeout=2&pool_max_size=8&auto_migrate=true"
REDIS_OPTIONS = "socket_timeout=1&socket_connect_timeout=0.5&retries=4"


@dataclass
class Load:
    """What the load saw: acknowledged completions, errors, and when calls failed."""

    acknowledged: dict[str, bytes] = field(default_factory=dict)
    typed: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    failures_ended: list[float] = field(default_factory=list)
    longest: float = 0.0


async def failover_under_load(
    url: str, fail_over: Callable[[], Awaitable[tuple[float, float]]]
) -> dict[str, Any]:
    """Load the store, run ``fail_over`` (it kills the primary and returns when, then when a
    replica was promoted, as ``time.monotonic()`` stamps), load again, then check every
    acknowledged completion."""
    load = Load()
    stop = asyncio.Event()

    async with open_store(url) as store:

        async def worker() -> None:
            while not stop.is_set():
                key = f"k-{uuid.uuid4().hex[:16]}"
                started = time.monotonic()
                try:
                    reservation = await store.reserve(key, "fp", lease_ttl=LEASE, retention=600)
                    if reservation.acquired:
                        assert reservation.lease is not None
                        response = key.encode()
                        if await store.complete(reservation.lease, response):
                            load.acknowledged[key] = response
                except IdemstoreError as exc:
                    load.typed.append(type(exc).__name__)
                    load.failures_ended.append(time.monotonic())
                except Exception as exc:  # a driver error that leaked: counted, and must be none
                    load.untyped.append(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
                    load.failures_ended.append(time.monotonic())
                load.longest = max(load.longest, time.monotonic() - started)
                if load.failures_ended and load.failures_ended[-1] >= started:
                    await asyncio.sleep(0.05)

        # The schema (auto_migrate) is in place, and on the standby, before the load starts.
        await store.get("warm-up")
        tasks = [asyncio.create_task(worker()) for _ in range(TASKS)]
        await asyncio.sleep(BEFORE)
        killed_at, promoted_at = await fail_over()
        await asyncio.sleep(AFTER)
        stop.set()
        await asyncio.gather(*tasks)

        lost = 0
        run_again = 0
        for key, response in load.acknowledged.items():
            record = await store.get(key)
            if record is None or record.response != response:
                lost += 1
            if record is None or record.status is not Status.COMPLETED:
                run_again += 1
    after_kill = [ended - killed_at for ended in load.failures_ended if ended >= killed_at]
    return {
        "fault": "failover",
        "acknowledged completions": len(load.acknowledged),
        "lost after failover": lost,
        "keys that would run again": run_again,
        "typed errors": len(load.typed),
        "error types": sorted(set(load.typed)),
        "untyped errors": len(load.untyped),
        "untyped error examples": load.untyped[:3],
        "promotion seconds": round(promoted_at - killed_at, 2),
        "recovery seconds": round(max(after_kill, default=0.0), 2),
        "longest call seconds": round(load.longest, 2),
        "tasks": TASKS,
        "load seconds": BEFORE + AFTER,
    }


# -- PostgreSQL ------------------------------------------------------------------------------


@dataclass
class PostgresPair:
    """A primary and its standby, which streams the primary's WAL through ``link``."""

    primary: PostgresServer
    standby: PostgresServer
    link: FaultProxy
    synchronous: bool

    @property
    def url(self) -> str:
        """A store URL listing both servers: it finds whichever accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
            f"&schema=idem_failover&{PG_OPTIONS}"
        )

    @property
    def setting(self) -> str:
        if self.synchronous:
            return "synchronous (`synchronous_commit=on`, `synchronous_standby_names='*'`)"
        return "asynchronous"


@pytest.fixture
def postgres_pair(request: pytest.FixtureRequest) -> Iterator[PostgresPair]:
    """A primary and its streaming standby; replication is synchronous when the test is
    parametrized (indirectly) with ``"sync"``."""
    require_driver("postgres", "asyncpg", "postgres")
    synchronous = request.param == "sync"
    settings = {"synchronous_standby_names": "*", "synchronous_commit": "on"}
    with (
        running(
            "postgres", lambda: start_postgres(settings=settings if synchronous else None)
        ) as primary,
        FaultProxy("127.0.0.1", primary.port) as link,
        running(
            "postgres (standby)",
            lambda: start_streaming_replica(primary, upstream_port=link.port),
        ) as standby,
    ):
        yield PostgresPair(primary, standby, link, synchronous)


@pytest.fixture
def postgres_failover(
    postgres_pair: PostgresPair, report_counts: Callable[[dict[str, Any]], None]
) -> Callable[[bool], Awaitable[dict[str, Any]]]:
    """Crash the primary under load and promote the standby, the standby cut off from the
    primary ``CUT_OFF`` seconds before the crash or not; report and return the counts."""
    pair = postgres_pair

    async def run(cut_off: bool) -> dict[str, Any]:
        async def crash_and_promote() -> tuple[float, float]:
            if cut_off:
                # A partition between the two: the primary goes on acknowledging (async) or
                # waits for the standby (sync), and the standby hears nothing more.
                await asyncio.to_thread(pair.link.hang)
                await asyncio.sleep(CUT_OFF)
            killed_at = time.monotonic()
            await asyncio.to_thread(pair.primary.stop_process, mode="immediate")
            # The bytes held in the partition are dropped, never delivered.
            await asyncio.to_thread(pair.link.stop)
            await asyncio.to_thread(pair.standby.promote)
            return killed_at, time.monotonic()

        counts = await failover_under_load(pair.url, crash_and_promote)
        standby = f"cut off {CUT_OFF} s before the crash" if cut_off else "streaming"
        counts = {"backend": "postgres", "setting": pair.setting, "standby": standby, **counts}
        report_counts(counts)
        assert counts["acknowledged completions"] > 0, counts
        # Every error on the way to the promoted standby was ours, not the driver's.
        assert counts["untyped errors"] == 0, counts
        # The store works on the new primary.
        assert pair.standby.sql("SELECT pg_is_in_recovery()") == "f"
        async with open_store(pair.url) as store:
            reservation = await store.reserve("after", "fp", lease_ttl=LEASE, retention=600)
            assert reservation.lease is not None
            assert await store.complete(reservation.lease, b"done")
        return counts

    return run


@pytest.mark.slow
@pytest.mark.parametrize("postgres_pair", ["sync"], indirect=True)
@pytest.mark.parametrize("cut_off", [False, True], ids=["streaming", "cut-off"])
async def test_a_synchronous_standby_promoted_keeps_every_acknowledged_completion(
    postgres_failover: Callable[[bool], Awaitable[dict[str, Any]]], cut_off: bool
) -> None:
    counts = await postgres_failover(cut_off)
    assert counts["lost after failover"] == 0, counts
    assert counts["keys that would run again"] == 0, counts


@pytest.mark.slow
@pytest.mark.parametrize("postgres_pair", ["async"], indirect=True)
@pytest.mark.parametrize("cut_off", [False, True], ids=["streaming", "cut-off"])
async def test_an_asynchronous_standby_promoted_loses_at_most_the_unreplicated_tail(
    postgres_failover: Callable[[bool], Awaitable[dict[str, Any]]], cut_off: bool
) -> None:
    counts = await postgres_failover(cut_off)
    # What asynchronous replication may lose is the tail the standby had not received: a lost
    # completion is a key a retry runs again, and nothing else.
    assert counts["keys that would run again"] == counts["lost after failover"], counts
    if cut_off:
        # Everything acknowledged during the cut never reached the standby: the count must
        # see that loss (the check that sync loses 0 means nothing if it could not).
        assert counts["lost after failover"] > 0, counts


# -- Redis Cluster ---------------------------------------------------------------------------


@pytest.fixture
def cluster_with_replicas(request: pytest.FixtureRequest) -> Iterator[LocalRedisCluster]:
    """Three primaries with one replica each; with AOF on every node when the test is
    parametrized (indirectly) with ``"aof"`` (``wait_replicas`` refuses a primary without)."""
    require_driver("redis", "redis", "redis")
    appendonly = getattr(request, "param", None) == "aof"
    with running(
        "redis (cluster)", lambda: start_redis_cluster(replicas=1, appendonly=appendonly)
    ) as cluster:
        yield cluster


async def redis_cluster_failover(
    cluster: LocalRedisCluster, wait_replicas: int, report_counts: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """SIGKILL one primary under load, wait for its replica's promotion, start the old primary
    again (it rejoins as a replica of the promoted one, so its shard has a replica again);
    report and return the counts."""
    victim = next(node for node in cluster.nodes if cluster.role_of(node) == "master")
    (replica,) = cluster.replicas_of(victim)

    async def kill_primary() -> tuple[float, float]:
        killed_at = time.monotonic()
        await asyncio.to_thread(victim.shutdown, kill=True)
        while await asyncio.to_thread(cluster.role_of, replica) != "master":
            assert time.monotonic() - killed_at < 30, "the cluster never promoted the replica"
            await asyncio.sleep(0.1)
        promoted_at = time.monotonic()
        await asyncio.to_thread(victim.start)
        return killed_at, promoted_at

    waiting = f"wait_replicas={wait_replicas}&wait_replicas_timeout=0.5"
    counts = await failover_under_load(f"{cluster.url}?{REDIS_OPTIONS}&{waiting}", kill_primary)
    setting = (
        f"`wait_replicas={wait_replicas}` (`appendonly yes`)"
        if wait_replicas
        else "`wait_replicas=0` (asynchronous)"
    )
    counts = {"backend": "redis-cluster", "setting": setting, "standby": "streaming", **counts}
    counts["wait_replicas"] = wait_replicas
    report_counts(counts)
    assert counts["acknowledged completions"] > 0, counts
    assert counts["untyped errors"] == 0, counts
    return counts


@pytest.mark.slow
async def test_a_redis_cluster_failover_loses_at_most_the_unreplicated_tail(
    cluster_with_replicas: LocalRedisCluster,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    counts = await redis_cluster_failover(cluster_with_replicas, 0, report_counts)
    # What asynchronous replication may lose is what the replica had not received: every
    # lost completion is a key that can run again, and nothing else is lost.
    assert counts["keys that would run again"] == counts["lost after failover"], counts


@pytest.mark.slow
@pytest.mark.parametrize("cluster_with_replicas", ["aof"], indirect=True)
async def test_a_redis_cluster_failover_with_wait_replicas_loses_no_acknowledged_completion(
    cluster_with_replicas: LocalRedisCluster,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    counts = await redis_cluster_failover(cluster_with_replicas, 1, report_counts)
    # A completion was acknowledged only once the replica had it, and that replica is the
    # one promoted: nothing acknowledged is lost, and no acknowledged key runs again.
    assert counts["lost after failover"] == 0, counts
    assert counts["keys that would run again"] == 0, counts
