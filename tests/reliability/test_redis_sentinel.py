"""Redis with Sentinel: the primary is killed under load, Sentinel promotes the replica, and
we count acknowledged completions lost and keys that ran again.

Redis replicates asynchronously: a completion acknowledged by the primary may not have
reached the replica when the primary dies, and after the failover that key runs again. With
``wait_replicas=1`` a ``complete`` returns only once the replica has the write (``WAIT``), so
with one replica promoted nothing acknowledged is lost. Both settings run here; the loss of
the default is measured (reported, not asserted: it depends on timing), the promise of the
other is asserted.

That promise needs a primary with persistence: one without it, restarted before Sentinel
notices, comes back empty and its replicas resync from it, dropping what ``WAIT`` confirmed.
The launcher gives every node an AOF; the last test here opts out of the store's refusal
(``volatile_primary=allow``) to show the loss it prevents, beside the same run with AOF.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import ConfigurationError, IdemstoreError, open_store
from idemstore.local_servers.redis import start_redis_sentinel
from idemstore.testing.fixtures import running

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from idemstore.local_servers.redis import LocalRedisSentinel

OPTIONS = "socket_timeout=1&socket_connect_timeout=0.5&retries=4"
TASKS = 16
BEFORE = 1.5  # seconds of load before the primary is killed
AFTER = 2.0  # seconds of load once a new primary is in place


@pytest.fixture
def sentinel_group() -> Iterator[LocalRedisSentinel]:
    with running(
        "redis (sentinel)",
        lambda: start_redis_sentinel(replicas=1, sentinels=3, down_after_ms=1000),
    ) as group:
        yield group


@pytest.fixture
def failover(
    sentinel_group: LocalRedisSentinel, report_counts: Callable[[dict[str, Any]], None]
) -> Callable[[int], Awaitable[dict[str, Any]]]:
    """Run ``failover_under_load`` with the given ``wait_replicas``, report its counts, and
    check that completions were acknowledged at all (else there was nothing to lose)."""

    async def run(wait_replicas: int) -> dict[str, Any]:
        counts = await failover_under_load(sentinel_group, wait_replicas)
        report_counts({"backend": "redis-sentinel", "fault": "failover", **counts})
        assert counts["acknowledged completions"] > 0
        return counts

    return run


async def failover_under_load(group: LocalRedisSentinel, wait_replicas: int) -> dict[str, Any]:
    """Load, SIGKILL the primary, wait for the promotion, load again; then count."""
    url = f"{group.url}?{OPTIONS}&wait_replicas={wait_replicas}&wait_replicas_timeout=0.5"
    acknowledged: dict[str, bytes] = {}
    executions: dict[str, int] = {}
    latencies: list[float] = []
    errors: list[str] = []
    stop = asyncio.Event()

    async with open_store(url) as store:

        async def load() -> None:
            while not stop.is_set():
                key = f"k-{uuid.uuid4().hex[:16]}"
                try:
                    reservation = await store.reserve(key, "fp", lease_ttl=30, retention=600)
                    if not reservation.acquired:
                        continue
                    assert reservation.lease is not None
                    executions[key] = executions.get(key, 0) + 1
                    response = key.encode()
                    started = time.monotonic()
                    if await store.complete(reservation.lease, response):
                        latencies.append(time.monotonic() - started)
                        acknowledged[key] = response
                except IdemstoreError as exc:
                    errors.append(type(exc).__name__)
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(load()) for _ in range(TASKS)]
        await asyncio.sleep(BEFORE)
        old = group.primary_port()
        assert old is not None
        victim = group.node_on(old)
        killed_at = time.monotonic()
        await asyncio.to_thread(victim.shutdown, kill=True)
        while group.primary_port() in (old, None):
            assert time.monotonic() - killed_at < 30, "Sentinel never promoted the replica"
            await asyncio.sleep(0.1)
        promoted_after = time.monotonic() - killed_at
        # Restart the old primary only once the new one has taken the master role itself:
        # a replica still following its old master's port would resync from it. Without
        # persistence (as this test once ran) the old one came back empty and the replica
        # dropped every record: one CI run lost 4,366 of 9,071 acknowledged completions, the
        # share written before the kill (see test_a_volatile_primary_restarted_... below).
        new = group.primary_port()
        assert new is not None
        while "role:master" not in group.node_on(new).cli("INFO", "replication", check=False):
            assert time.monotonic() - killed_at < 30, "the new primary never took the role"
            await asyncio.sleep(0.1)
        # And only once every Sentinel names the new primary. A run on 2026-12-02 without
        # persistence lost 2,636 of 6,378 with the checks above passed: the old primary, back
        # empty and still a master for a moment, is the cause the restart test below shows.
        while not group.sentinels_agree_on(new):
            assert time.monotonic() - killed_at < 30, "the Sentinels never agreed on a primary"
            await asyncio.sleep(0.1)
        # The old primary comes back (with its AOF) and Sentinel makes it a replica of the
        # new one, which it resyncs from, so writes can be confirmed by a replica again.
        await asyncio.to_thread(victim.start)
        await asyncio.to_thread(group.wait_replicas_synced)
        await asyncio.sleep(AFTER)
        stop.set()
        await asyncio.gather(*tasks)

        lost = 0
        ran_again = 0
        for key, response in acknowledged.items():
            record = await store.get(key)
            if record is None or record.response != response:
                lost += 1
            reservation = await store.reserve(key, "fp", lease_ttl=30, retention=600)
            if reservation.acquired:
                ran_again += 1  # a retry of an acknowledged call would have run it twice
    return {
        "wait_replicas": wait_replicas,
        "acknowledged completions": len(acknowledged),
        "lost after failover": lost,
        "keys that would run again": ran_again,
        "typed errors": len(errors),
        "promotion seconds": round(promoted_after, 2),
        "complete p50 ms": round(statistics.median(latencies) * 1000, 3) if latencies else None,
        "complete p99 ms": (
            round(statistics.quantiles(latencies, n=100)[98] * 1000, 3)
            if len(latencies) >= 100
            else None
        ),
    }


@pytest.mark.slow
async def test_completions_confirmed_by_a_replica_survive_a_sentinel_failover(
    failover: Callable[[int], Awaitable[dict[str, Any]]],
) -> None:
    counts = await failover(1)
    assert counts["lost after failover"] == 0, counts
    assert counts["keys that would run again"] == 0, counts


@pytest.mark.slow
async def test_a_sentinel_failover_without_wait_loses_at_most_the_unreplicated_tail(
    failover: Callable[[int], Awaitable[dict[str, Any]]],
) -> None:
    counts = await failover(0)
    # What asynchronous replication may lose is what the replica had not received: every
    # lost completion is a key that can run again, and nothing else is lost.
    assert counts["keys that would run again"] == counts["lost after failover"], counts


RESTART_LOAD = 0.8  # seconds of load before the primary is SIGKILLed and started again
# What Redis logs when an everysec fsync still running made it hold the AOF write back for
# 2 s (while answering clients). Shorter hold-backs are not logged, so 0 proves nothing.
POSTPONED = "Asynchronous AOF fsync is taking too long"


@pytest.mark.slow
@pytest.mark.parametrize("appendfsync", [None, "everysec", "always"], ids=lambda v: f"aof-{v}")
async def test_a_volatile_primary_restarted_before_failover_loses_what_wait_confirmed(
    appendfsync: str | None, report_counts: Callable[[dict[str, Any]], None]
) -> None:
    """The primary is SIGKILLed under ``wait_replicas=1`` load and started again at once, well
    inside Sentinel's down-after, so no failover happens; the replica resyncs from whatever it
    came back with. Without persistence that is nothing: every completion ``WAIT`` confirmed
    before the kill is gone (the store refuses such a primary unless told
    ``volatile_primary=allow``). With ``appendfsync always`` nothing is lost. With
    ``everysec`` the loss is measured, not asserted (1 run in 12 lost 12 completions): Redis
    answers clients while it holds the AOF write back behind a slow fsync, the likely cause."""
    with running(
        "redis (sentinel)",
        lambda: start_redis_sentinel(
            appendonly=appendfsync is not None,
            appendfsync=appendfsync or "everysec",
            down_after_ms=10_000,
        ),
    ) as group:
        policy = "allow" if appendfsync is None else "refuse"
        url = f"{group.url}?{OPTIONS}&wait_replicas=1&wait_replicas_timeout=0.5"
        acknowledged: list[str] = []
        errors: list[str] = []
        stop = asyncio.Event()
        async with open_store(f"{url}&volatile_primary={policy}") as store:

            async def load() -> None:
                while not stop.is_set():
                    key = f"k-{uuid.uuid4().hex[:16]}"
                    try:
                        reservation = await store.reserve(key, "fp", lease_ttl=30, retention=600)
                        assert reservation.lease is not None
                        if await store.complete(reservation.lease, key.encode()):
                            acknowledged.append(key)
                    except IdemstoreError as exc:
                        errors.append(type(exc).__name__)
                        await asyncio.sleep(0.05)

            tasks = [asyncio.create_task(load()) for _ in range(8)]
            await asyncio.sleep(RESTART_LOAD)
            await asyncio.to_thread(group.primary.restart, kill=True)
            await asyncio.to_thread(group.wait_replicas_synced)
            stop.set()
            await asyncio.gather(*tasks)
            # No failover: the restarted node is still the one the Sentinels name.
            assert group.primary_port() == group.primary.port
            lost = 0
            for key in acknowledged:
                record = await store.get(key)
                if record is None or record.response != key.encode():
                    lost += 1
        postponed = group.primary.log.read_text(errors="replace").count(POSTPONED)
        counts = {
            "backend": "redis-sentinel",
            "fault": "primary restarted before failover",
            "persistence": f"appendonly yes, appendfsync {appendfsync}" if appendfsync else "none",
            "wait_replicas": 1,
            "acknowledged completions": len(acknowledged),
            "lost after restart": lost,
            "AOF writes held back 2 s": postponed,
            "typed errors": len(errors),
        }
        report_counts(counts)
        assert len(acknowledged) > 0, counts
        if appendfsync is None:
            assert lost > 0, counts  # the hazard the default refusal prevents
        elif appendfsync == "always":
            assert lost == 0, counts


@pytest.mark.slow
async def test_a_failover_to_a_replica_without_persistence_is_refused_by_default() -> None:
    """The check runs again on the first connection to a new primary: a store that accepted
    a primary with AOF refuses the replica Sentinel promotes when that one has none."""
    with running("redis (sentinel)", lambda: start_redis_sentinel(down_after_ms=1000)) as group:
        (replica,) = group.replicas
        replica.cli("CONFIG", "SET", "appendonly", "no")
        # The first write only sets the scene: a CI run on a loaded machine saw its replica
        # acknowledge later than 0.5 s, so it gets a WAIT that returns on the ack, not a race.
        options = "socket_timeout=10&socket_connect_timeout=0.5&retries=4"
        url = f"{group.url}?{options}&wait_replicas=1&wait_replicas_timeout=5"
        async with open_store(url) as store:
            first = await store.reserve("before", "fp", lease_ttl=30, retention=600)
            assert first.acquired
            await asyncio.to_thread(group.primary.shutdown, kill=True)
            killed_at = time.monotonic()
            refused = None
            while refused is None:
                assert time.monotonic() - killed_at < 30, "the promoted replica was never used"
                try:
                    await store.reserve(f"k-{uuid.uuid4().hex}", "fp", lease_ttl=30, retention=600)
                except ConfigurationError as exc:
                    refused = exc
                except IdemstoreError:
                    await asyncio.sleep(0.2)  # no primary yet, or its connections breaking
            assert group.primary_port() == replica.port
            assert f"primary 127.0.0.1:{replica.port}" in str(refused)
            assert "no persistence" in str(refused)
