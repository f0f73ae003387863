"""The store's clock-skew check (``max_clock_skew``, ``clock_skew_policy``) on real engines
whose clocks a test moves (``clock_shift``).

Redis and PostgreSQL measure leases with the engine's clock; a node whose clock is ahead
of the others (a replica that may be promoted, a server whose clock was stepped) makes a live
lease look lapsed there. The store reads the clock of every node it reaches (the server, the
replicas Sentinel names, every Cluster node, every host of a PostgreSQL host list) at connect
and every ``clock_check_interval``, and warns, or refuses calls, with the skew in the
message and in ``store.clocks.skew``. Each test here fails without the check.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import StoreUnavailableError, open_store
from idemstore.backends.clock_skew import ClockReading, ClockWatch
from idemstore.local_servers.postgres import start_postgres, start_streaming_replica
from idemstore.local_servers.redis import (
    start_redis,
    start_redis_cluster,
    start_redis_sentinel,
)
from idemstore.testing.fixtures import require_driver, running
from tests.reliability.clock_shift import SETTLES, ShiftedClock

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.local_servers.redis import LocalRedis

pytestmark = pytest.mark.slow

REFUSE = "clock_skew_policy=refuse&max_clock_skew=1"


@pytest.fixture
def clock() -> Iterator[ShiftedClock]:
    shifted = ShiftedClock()
    yield shifted
    shifted.remove()


def restart_with(node: LocalRedis, clock: ShiftedClock) -> None:
    node.shutdown()
    node.environment = clock.environment("redis")
    node.start()


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


async def reserve(store: Any) -> None:
    await store.reserve(key(), "fp", lease_ttl=5, retention=60)


async def first_refusal(store: Any, *, until_accepted: bool = False) -> str:
    """The first refusal's message within the time a clock change takes to land (or, with
    ``until_accepted``, "" once a call is accepted again)."""
    deadline = time.monotonic() + SETTLES + 2
    while time.monotonic() < deadline:
        try:
            await reserve(store)
        except StoreUnavailableError as exc:
            if not until_accepted:
                return str(exc)
        else:
            if until_accepted:
                return ""
        await asyncio.sleep(0.05)
    pytest.fail("the clock's change was never seen")


@pytest.fixture
def redis_server(clock: ShiftedClock) -> Iterator[LocalRedis]:
    require_driver("redis", "redis", "redis")
    with running("redis", start_redis) as server:
        restart_with(server, clock)
        yield server


async def test_a_redis_server_ahead_past_the_bound_is_refused_with_the_skew(
    redis_server: LocalRedis, clock: ShiftedClock
) -> None:
    clock.set(5)
    await asyncio.sleep(0.1)  # the shim reads the offset every 20 ms
    async with open_store(f"{redis_server.url}?{REFUSE}") as store:
        with pytest.raises(StoreUnavailableError, match=r"differ by [45]\.\d{3} s") as raised:
            await reserve(store)
        assert "max_clock_skew (1.000 s)" in str(raised.value)
        skew = store.clocks.skew
        assert 4.5 < skew.largest < 5.5, skew
        assert skew.refusing and skew.refusals >= 1 and skew.checks == 1, skew


async def test_a_redis_server_behind_past_the_bound_is_warned_about_and_serves(
    redis_server: LocalRedis, clock: ShiftedClock, caplog: pytest.LogCaptureFixture
) -> None:
    clock.set(-5)
    await asyncio.sleep(0.1)  # the shim reads the offset every 20 ms
    with caplog.at_level(logging.WARNING, logger="idemstore.clock_skew"):
        async with open_store(redis_server.url) as store:
            await reserve(store)
            await reserve(store)
            assert store.clocks.skew.warnings == 1
            assert not store.clocks.skew.refusing
    warned = [r.getMessage() for r in caplog.records if "differ by" in r.getMessage()]
    assert len(warned) == 1 and re.search(r"server -(4\.9|5\.0)", warned[0]), warned


async def test_a_redis_clock_within_the_bound_passes(
    redis_server: LocalRedis, clock: ShiftedClock
) -> None:
    clock.set(0.5)
    await asyncio.sleep(0.1)  # the shim reads the offset every 20 ms
    async with open_store(f"{redis_server.url}?{REFUSE}") as store:
        await reserve(store)
        assert store.clocks.skew.largest < 1.0
        assert store.clocks.skew.readings[0].offset == pytest.approx(0.5, abs=0.2)


async def test_a_step_of_the_redis_clock_mid_run_is_refused_until_it_is_undone(
    redis_server: LocalRedis, clock: ShiftedClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_store(f"{redis_server.url}?{REFUSE}&clock_check_interval=0.2") as store:
        await reserve(store)
        clock.set(30)
        with caplog.at_level(logging.WARNING, logger="idemstore.clock_skew"):
            refused = await first_refusal(store)
            assert re.search(r"differ by (29|30)\.\d{3} s", refused), refused
            clock.set(0)
            assert await first_refusal(store, until_accepted=True) == ""
        assert any("agree again" in r.getMessage() for r in caplog.records)


async def test_allow_reads_no_clock(redis_server: LocalRedis, clock: ShiftedClock) -> None:
    clock.set(30)
    await asyncio.sleep(0.1)  # the shim reads the offset every 20 ms
    async with open_store(f"{redis_server.url}?clock_skew_policy=allow") as store:
        await reserve(store)
        assert store.clocks.skew.checks == 0


async def test_a_sentinel_replica_ahead_is_named_though_the_primary_agrees(
    clock: ShiftedClock,
) -> None:
    require_driver("redis", "redis", "redis")
    with running("redis", lambda: start_redis_sentinel(sentinels=1)) as group:
        replica = group.replicas[0]
        restart_with(replica, clock)
        group.wait_replicas_synced()
        clock.set(5)
        await asyncio.sleep(0.1)
        async with open_store(f"{group.url}?{REFUSE}") as store:
            with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{replica.port}"):
                await reserve(store)
            offsets = {r.node: r.offset for r in store.clocks.skew.readings}
            assert offsets["primary"] == pytest.approx(0, abs=0.2), offsets
            assert offsets[f"127.0.0.1:{replica.port} (replica)"] == pytest.approx(5, abs=0.3)


async def test_a_cluster_replica_ahead_is_named(clock: ShiftedClock) -> None:
    require_driver("redis", "redis", "redis")
    with running("redis-cluster", lambda: start_redis_cluster(replicas=1)) as cluster:
        replica = cluster.replicas_of(cluster.nodes[0])[0]
        restart_with(replica, clock)
        cluster.wait_ok()
        clock.set(5)
        await asyncio.sleep(0.1)
        async with open_store(f"{cluster.url}?{REFUSE}") as store:
            with pytest.raises(StoreUnavailableError, match=f":{replica.port} \\(replica\\)"):
                await reserve(store)
            assert len(store.clocks.skew.readings) == 6, store.clocks.skew


async def test_a_postgres_server_ahead_is_refused_with_the_skew(clock: ShiftedClock) -> None:
    require_driver("postgres", "asyncpg", "postgres")
    with running("postgres", start_postgres) as server:
        server.stop_process()
        server.environment = clock.environment("faketime")
        clock.set(5)
        server.start()
        url = f"{server.url}?auto_migrate=true&schema=idem_clock&{REFUSE}"
        async with open_store(url) as store:
            with pytest.raises(StoreUnavailableError, match=r"server \+[45]\.\d{3} s"):
                await reserve(store)
            assert 4.5 < store.clocks.skew.largest < 5.5


async def test_a_postgres_standby_ahead_in_the_host_list_is_named(clock: ShiftedClock) -> None:
    require_driver("postgres", "asyncpg", "postgres")
    with (
        running("postgres", start_postgres) as primary,
        running("postgres (standby)", lambda: start_streaming_replica(primary)) as standby,
    ):
        standby.stop_process()
        standby.environment = clock.environment("faketime")
        clock.set(-5)
        standby.start()
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        url = (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
            f"&auto_migrate=true&schema=idem_clock&{REFUSE}"
        )
        async with open_store(url) as store:
            with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{standby.port} -[45]"):
                await reserve(store)


def test_round_trip_uncertainty_never_counts_as_skew() -> None:
    watch = ClockWatch("store", bound=1.0, policy="refuse", interval=0)
    # Two nodes 1.4 s apart, each read within ±0.3 s: at least 0.8 s apart for sure.
    watch.judge((ClockReading("a", 0.7, 0.3), ClockReading("b", -0.7, 0.3)), ())
    assert watch.skew.largest == pytest.approx(0.8)
    watch.check_calls()
    watch.judge((ClockReading("a", 1.7, 0.3),), ())
    assert watch.skew.largest == pytest.approx(1.4)
    with pytest.raises(StoreUnavailableError):
        watch.check_calls()


async def test_the_skew_is_a_gauge_of_the_instrumented_store(
    redis_server: LocalRedis, clock: ShiftedClock
) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from idemstore.telemetry.instruments import Instruments

    reader = InMemoryMetricReader()
    instruments = Instruments(sdk.MeterProvider(metric_readers=[reader]), None, False)
    clock.set(5)
    await asyncio.sleep(0.1)  # the shim reads the offset every 20 ms
    async with open_store(redis_server.url) as store:
        await reserve(instruments.wrap(store))
        data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "idemstore.store.clock_skew"
        for point in metric.data.data_points
    ]
    assert len(points) == 1 and 4.5 < points[0].value < 5.5, points
    assert points[0].attributes == {"idemstore.backend": "redis"}
