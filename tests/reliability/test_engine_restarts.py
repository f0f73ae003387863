"""PostgreSQL (directly and through PgBouncer), PgBouncer itself, and Redis (``appendonly
yes``, ``appendfsync always``) crash or restart while worker processes run: no acknowledged
completion is lost, calls during the outage fail fast with ``StoreUnavailableError``, the same
store objects carry on by themselves afterwards, and the history checks out. Each test starts
servers of its own, since it restarts them."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import StoreUnavailableError, open_store
from idemstore.local_servers.postgres import start_pgbouncer, start_postgres
from idemstore.testing.fixtures import running
from idemstore.testing.fixtures.postgres import migrate_schema, new_schema, with_options
from tests.reliability.history import FaultScenario, WorkerConfig, read_events, run_history

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from idemstore.local_servers.postgres import PgBouncerServer, PostgresServer
    from idemstore.local_servers.redis import LocalRedis

SLACK = 2.0  # headroom for a loaded 2-core machine; bounds a hang, not a latency figure
# Timeouts the workers and the probe run with, and the longest a call may then take (see
# tests/reliability/test_network_faults.py for how each bound follows from its options).
REDIS_OPTIONS = "socket_timeout=0.5&socket_connect_timeout=0.5&retries=1"
REDIS_BOUND = (1 + 1) * (0.5 + 0.5) + 0.5 + SLACK
POSTGRES_OPTIONS = "command_timeout=1&connect_timeout=1"
POSTGRES_BOUND = 1 + 1 + SLACK
OUTAGE = 1.0  # seconds each engine stays down
# What a test takes its engine through: a label, how to take the engine down, how to bring it up.
Restarts = list[tuple[str, "Callable[[], None]", "Callable[[], None]"]]


def acknowledged(directory: Path, before: float) -> dict[str, tuple[int, str, str]]:
    """Per key, the completion a worker was told was stored before ``before``: fence, token,
    response (hex)."""
    events = read_events(sorted(directory.glob("w*.jsonl")))
    responses = {
        (e["key"], e["fence"], e["token"]): e["response"] for e in events if e["ev"] == "completing"
    }
    return {
        e["key"]: (e["fence"], e["token"], responses[(e["key"], e["fence"], e["token"])])
        for e in events
        if e["ev"] == "end" and e["outcome"] == "completed" and e["t1"] < before
    }


class EngineRestarts(FaultScenario):
    """Take the engine down and up again a few times while the workers run.

    One store object (``probe``) lives through every restart: during each outage its calls
    must fail with ``StoreUnavailableError`` within ``bound``; afterwards it must work again
    by itself, and read back every completion acknowledged to a worker before the crash.
    """

    def __init__(
        self,
        url: str,
        directory: Path,
        restarts: Restarts,
        bound: float,
    ) -> None:
        super().__init__()
        self.url = url
        self.directory = directory
        self.restarts = restarts
        self.bound = bound
        self.slowest_refusal = 0.0
        self.slowest_recovery = 0.0

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self._run(stop))

    async def _run(self, stop: threading.Event) -> None:
        probe = open_store(self.url)
        try:
            await probe.ping()
            for label, down, up in self.restarts:
                await asyncio.to_thread(stop.wait, 1.5)  # let the workers get going
                if stop.is_set():
                    return
                crash = time.time()
                await asyncio.to_thread(down)
                self.counts["engine restarts"] += 1
                acked = acknowledged(self.directory, crash)
                await self._outage(probe, label)
                await asyncio.to_thread(up)
                started = time.monotonic()
                await self._recovered(probe, label)
                self.slowest_recovery = max(self.slowest_recovery, time.monotonic() - started)
                for key, (fence, token, response) in acked.items():
                    record = await probe.get(key)
                    if (
                        record is None
                        or record.response is None
                        or (
                            record.fence,
                            record.token,
                            record.response.hex(),
                        )
                        != (fence, token, response)
                    ):
                        self.problems.append(
                            f"{label}: completion of {key} (fence {fence}) acknowledged before "
                            f"the crash reads back as {record}"
                        )
                self.counts["acknowledged completions read back after a restart"] += len(acked)
            # Workers carry on after the last restart; on a loaded machine their pools may need
            # longer than the 1.5 s to reconnect, so give them until each has a success again
            # (bounded: a worker that never recovers still fails the test).
            await asyncio.to_thread(stop.wait, 1.5)
            settle_by = time.monotonic() + 15
            while workers_recovered(self.directory) and time.monotonic() < settle_by:
                await asyncio.to_thread(stop.wait, 0.25)
        finally:
            await probe.close()
            self.counts["slowest refusal (s)"] = round(self.slowest_refusal, 3)
            self.counts["slowest recovery (s)"] = round(self.slowest_recovery, 3)

    async def _outage(self, probe: Any, label: str) -> None:
        until = time.monotonic() + OUTAGE
        while time.monotonic() < until:
            key = f"probe-{uuid.uuid4().hex[:12]}"
            started = time.monotonic()
            try:
                await probe.reserve(key, "fp", lease_ttl=10, retention=60)
            except StoreUnavailableError:
                pass
            except Exception as exc:
                self.problems.append(f"{label}: during the outage reserve raised {exc!r}")
            else:
                self.problems.append(f"{label}: reserve succeeded while the engine was down")
            seconds = time.monotonic() - started
            self.slowest_refusal = max(self.slowest_refusal, seconds)
            if seconds > self.bound:
                self.problems.append(f"{label}: a refusal took {seconds:.2f}s > {self.bound}s")
            self.counts["calls refused during outages"] += 1
            await asyncio.sleep(0.1)

    async def _recovered(self, probe: Any, label: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                await probe.get(f"probe-{uuid.uuid4().hex[:12]}")
                return
            except StoreUnavailableError:
                if time.monotonic() > deadline:
                    self.problems.append(f"{label}: the store did not recover within 30s")
                    raise
                await asyncio.sleep(0.05)


def workers_recovered(directory: Path) -> list[str]:
    """Workers whose last event was an error: their store never came back by itself.

    Only each worker's last generation (``w{index}.{generation}``) counts: an earlier one was
    killed, and its log ends wherever the kill found it, an error during an outage included.
    """
    last: dict[str, str] = {}
    newest: dict[str, tuple[int, str]] = {}
    for path in sorted(directory.glob("w*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            last[event["w"]] = event["ev"]
    for worker in last:
        index, _, generation = worker.rpartition(".")
        if int(generation) >= newest.get(index, (-1, ""))[0]:
            newest[index] = (int(generation), worker)
    return [worker for _, worker in newest.values() if last[worker] == "error"]


def crash_stop_crash(
    crash: Callable[[], None], stop: Callable[[], None], start: Callable[[], None]
) -> Restarts:
    """A crash, a clean shutdown, and a crash again, each followed by ``start``."""
    return [("crash", crash, start), ("clean shutdown", stop, start), ("crash again", crash, start)]


def assert_restarts_lose_nothing(
    backend: str,
    url: str,
    restarts: Restarts,
    bound: float,
    directory: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    """Run the workers on ``url`` through ``restarts`` (label, down, up), report the run as
    ``backend``'s, and check that nothing acknowledged was lost and every call ended within
    ``bound`` (``wait`` also within its lease)."""
    config = WorkerConfig(call_cap=bound * 3)
    scenario = EngineRestarts(url, directory, restarts, bound)
    report = run_history(url, directory, kills=3, config=config, seed=seed, scenario=scenario)
    report_counts({"backend": backend, "fault": "restarts", **report.row()})
    assert report.violations == [], report.summary()
    assert report.untyped_errors == [], report.summary()
    assert report.run["engine restarts"] >= 2
    assert report.counts["errors"] > 0, "no worker call ever met an outage"
    assert report.run["acknowledged completions read back after a restart"] > 0
    assert workers_recovered(directory) == []
    for op, seconds in report.max_call_seconds.items():
        limit = bound + (config.lease_ttl * 2 if op == "wait" else 0)
        assert seconds < limit, (op, seconds, report.summary())


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, since it crashes it."""
    with running("postgres", start_postgres) as server:
        yield server


@pytest.fixture
def own_pgbouncer(own_postgres: PostgresServer) -> Iterator[PgBouncerServer]:
    """A PgBouncer of this test's own (transaction pooling) in front of ``own_postgres``."""
    with running(
        "postgres (pgbouncer)", lambda: start_pgbouncer("127.0.0.1", own_postgres.port)
    ) as bouncer:
        yield bouncer


@pytest.mark.slow
def test_redis_crashes_lose_no_acknowledged_completion_with_appendfsync_always(
    own_redis: LocalRedis,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    def crash() -> None:
        own_redis.shutdown(kill=True)  # SIGKILL; a plain shutdown is SIGTERM

    assert_restarts_lose_nothing(
        "redis",
        f"{own_redis.url}?{REDIS_OPTIONS}&prefix=restarts:",
        crash_stop_crash(crash, own_redis.shutdown, own_redis.start),
        REDIS_BOUND,
        tmp_path,
        seed,
        report_counts,
    )


@pytest.mark.slow
def test_postgres_crashes_and_restarts_lose_no_acknowledged_completion(
    own_postgres: PostgresServer,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    schema_url = with_options(own_postgres.url, schema=new_schema())
    asyncio.run(migrate_schema(schema_url))

    def crash() -> None:
        own_postgres.stop_process(mode="immediate")  # a plain stop_process is a fast shutdown

    assert_restarts_lose_nothing(
        "postgres",
        f"{schema_url}&{POSTGRES_OPTIONS}",
        crash_stop_crash(crash, own_postgres.stop_process, own_postgres.start),
        POSTGRES_BOUND,
        tmp_path,
        seed,
        report_counts,
    )


@pytest.mark.slow
def test_pgbouncer_restarts_and_a_postgres_fast_shutdown_lose_no_acknowledged_completion(
    own_postgres: PostgresServer,
    own_pgbouncer: PgBouncerServer,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    schema = new_schema()
    asyncio.run(migrate_schema(with_options(own_postgres.url, schema=schema)))
    # As docs/backends/postgres.md recommends behind PgBouncer: no statement cache, LISTEN
    # straight to the server.
    url = with_options(
        own_pgbouncer.url, schema=schema, statement_cache_size="0", listen_dsn=own_postgres.url
    )
    assert_restarts_lose_nothing(
        "pgbouncer",
        f"{url}&{POSTGRES_OPTIONS}",
        [
            (
                "PgBouncer safe shutdown (SIGINT)",
                lambda: own_pgbouncer.shutdown(signal.SIGINT),
                own_pgbouncer.start,
            ),
            ("PostgreSQL fast shutdown", own_postgres.stop_process, own_postgres.start),
            (
                "PgBouncer crash (SIGKILL)",
                lambda: own_pgbouncer.shutdown(signal.SIGKILL),
                own_pgbouncer.start,
            ),
        ],
        POSTGRES_BOUND,
        tmp_path,
        seed,
        report_counts,
    )


def test_acknowledged_reads_only_completions_told_before_the_crash(tmp_path: Path) -> None:
    ids = {"w": "a", "key": "k", "fence": 1, "token": "t"}
    lines = [
        {"ev": "completing", **ids, "t0": 1.0, "response": "00"},
        {"ev": "end", **ids, "t0": 1.0, "t1": 2.0, "outcome": "completed"},
        {"ev": "completing", **ids, "key": "late", "t0": 5.0, "response": "01"},
        {"ev": "end", **ids, "key": "late", "t0": 5.0, "t1": 6.0, "outcome": "completed"},
    ]
    (tmp_path / "w0.0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert acknowledged(tmp_path, before=3.0) == {"k": (1, "t", "00")}
