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

from idemstore import IdemstoreError, Status, open_store
from idemstore.local_servers import free_port
from idemstore.local_servers.postgres import PostgresServer, start_postgres
from idemstore.testing.fixtures import require_driver, running
from tests.reliability.partitions import Network

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

pytestmark = pytest.mark.slow

# The test command runs the recommended setting; the campaign both
# (IDEMSTORE_PARTITION_SETTINGS=sync,async).
PG_SETTINGS = (os.environ.get("IDEMSTORE_PARTITION_SETTINGS") or "sync").split(",")
TASKS = 6
CUT = 1.5  # seconds between the partition's steps
LEASE = 60.0  # longer than the run: a key runs only in the task that reserved it
PG_OPTIONS = "connect_timeout=1&command_timeout=2&pool_max_size=8&auto_migrate=true"
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


async def under_load(
    url: str, steps: Callable[[], Awaitable[dict[str, float]]]
) -> tuple[Load, dict[str, float]]:
    """Tasks reserve and complete new keys on ``url`` while ``steps`` runs the partition
    (it returns its moments, ``time.monotonic()`` stamps); then one more ``CUT`` of load."""
    load = Load()
    stop = asyncio.Event()
    async with open_store(url) as store:
        await store.get("warm-up")

        async def worker() -> None:
            while not stop.is_set():
                key = f"k-{uuid.uuid4().hex[:16]}"
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
    url = f"{server.url}?schema=idem_apart&{PG_OPTIONS}"

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
        "backend": "postgres",
        "setting": "a single server cut off from its clients for 1.5 s",
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
    # Every call ended within its bound: command_timeout (2 s) plus a connect (1 s), and slack.
    assert counts["longest call seconds"] < 2 + 1 + 2, counts
    # The store came back by itself: calls failed for at most a bound after the link healed.
    assert counts["recovery seconds"] < 2 + 1 + 2, counts
