"""What the SQLite backend promises beyond the contract suite: URLs, pragmas, schema handling,
error mapping, several connections (and processes) on one file, and the CLI on a real file."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("aiosqlite", reason="the sqlite backend needs aiosqlite")

from idemstore import (
    ConfigurationError,
    Outcome,
    ResponseTooLargeError,
    SchemaError,
    Status,
    StoreUnavailableError,
    open_store,
)
from idemstore.backends.migrate import load_migrations
from idemstore.backends.sqlite import SQLiteStore, split_statements
from idemstore.backends.sqlite import store as sqlite_backend
from idemstore.cli import main
from idemstore.protocol import Checkpoint, Lease
from idemstore.testing import FakeClock
from tests.conftest import ROOT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from pathlib import Path

    from idemstore import IdempotencyStore, Record

LONG = 60.0


def file_url(path: Path, query: str = "") -> str:
    return f"sqlite:///{path}" + (f"?{query}" if query else "")


# -- URLs and options ------------------------------------------------------------------------


def test_three_slashes_name_a_relative_path() -> None:
    assert SQLiteStore.from_url("sqlite:///data/idem.db").database == "data/idem.db"


def test_four_slashes_name_an_absolute_path() -> None:
    assert SQLiteStore.from_url("sqlite:////var/lib/idem.db").database == "/var/lib/idem.db"


def test_memory_url_names_an_in_memory_database() -> None:
    assert SQLiteStore.from_url("sqlite:///:memory:").database == ":memory:"


def test_percent_escapes_in_the_path_are_decoded() -> None:
    assert SQLiteStore.from_url("sqlite:///my%20dir/idem.db").database == "my dir/idem.db"


async def test_a_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_store("sqlite:///relative.db") as store:
        await store.ping()
    assert (tmp_path / "relative.db").is_file()


def test_a_clock_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="clock"):
        open_store("sqlite:///idem.db", clock="yesterday")


# -- pragmas -----------------------------------------------------------------------------------


async def pragma(store: SQLiteStore, name: str) -> object:
    """A pragma as the store's own connection sees it (synchronous is per connection)."""
    conn = await store._connect()
    rows = list(await conn.execute_fetchall(f"PRAGMA {name}"))
    return rows[0][0]


async def test_a_file_store_uses_wal(tmp_path: Path) -> None:
    async with SQLiteStore(str(tmp_path / "idem.db")) as store:
        assert await pragma(store, "journal_mode") == "wal"


async def test_synchronous_is_full_by_default(tmp_path: Path) -> None:
    async with SQLiteStore(str(tmp_path / "idem.db")) as store:
        assert await pragma(store, "synchronous") == 2  # FULL


async def test_synchronous_normal_can_be_asked_for_in_the_url(tmp_path: Path) -> None:
    async with open_store(file_url(tmp_path / "idem.db", "synchronous=normal")) as store:
        assert isinstance(store, SQLiteStore)
        assert await pragma(store, "synchronous") == 1  # NORMAL


@contextlib.contextmanager
def write_lock_held_elsewhere(
    path: Path, *, for_seconds: float | None = None
) -> Iterator[threading.Event]:
    """Another connection, as another process would, holds the file's write lock until the
    block ends, or (``for_seconds``) until a timer lets go earlier; the event says it let go."""
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    released = threading.Event()
    letting_go = threading.Lock()

    def let_go() -> None:
        with letting_go:
            if not released.is_set():
                blocker.execute("ROLLBACK")
                released.set()

    timer = threading.Timer(for_seconds, let_go) if for_seconds is not None else None
    if timer is not None:
        timer.start()
    try:
        yield released
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        let_go()
        blocker.close()


async def test_busy_timeout_from_the_url_is_the_budget_the_error_names(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    async with open_store(file_url(path, "busy_timeout=0.25")) as store:
        await store.ping()
        with (
            write_lock_held_elsewhere(path),
            pytest.raises(StoreUnavailableError, match=r"busy_timeout=0\.25s"),
        ):
            await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)


# -- schema ------------------------------------------------------------------------------------


def versions(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT name, checksum FROM idemstore_migrations").fetchall()


async def test_a_fresh_file_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    async with SQLiteStore(str(path)) as store:
        await store.ping()
    assert versions(path) == [(m.name, m.checksum) for m in load_migrations("sqlite")]


async def test_auto_migrate_false_refuses_a_fresh_file_naming_the_command(tmp_path: Path) -> None:
    url = file_url(tmp_path / "idem.db", "auto_migrate=false")
    with pytest.raises(SchemaError, match="idemstore migrate sqlite:///"):
        async with open_store(url):
            pass


@pytest.fixture
async def migrated_file(tmp_path: Path) -> Path:
    """A database file a store has opened (and so migrated) and closed again."""
    path = tmp_path / "idem.db"
    async with SQLiteStore(str(path)):
        pass
    return path


async def test_auto_migrate_false_opens_a_migrated_file(migrated_file: Path) -> None:
    async with open_store(file_url(migrated_file, "auto_migrate=false")) as store:
        reservation = await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        assert reservation.acquired


@pytest.mark.parametrize(
    ("tampering", "refusal"),
    [
        ("UPDATE idemstore_migrations SET checksum = 'edited'", "changed after it was applied"),
        (
            "INSERT INTO idemstore_migrations VALUES ('9999_from_the_future.sql', 'x', 0)",
            "upgrade idemstore",
        ),
    ],
    ids=["an-edited-migration", "a-schema-from-a-newer-version"],
)
async def test_a_migrations_table_this_version_did_not_write_is_refused_on_open(
    migrated_file: Path, tampering: str, refusal: str
) -> None:
    with sqlite3.connect(migrated_file) as conn:
        conn.execute(tampering)
    with pytest.raises(SchemaError, match=refusal):
        async with SQLiteStore(str(migrated_file)):
            pass


async def test_a_missing_records_table_is_a_schema_error(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    async with SQLiteStore(str(path)) as store:
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TABLE idemstore_records")
        with pytest.raises(SchemaError, match="idemstore migrate"):
            await store.get("k")


async def test_stores_opening_a_fresh_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    stores = [SQLiteStore(str(path)) for _ in range(4)]
    try:
        # Each store has its own connection and thread: the migrations really race.
        await asyncio.gather(*(store.ping() for store in stores))
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    assert versions(path) == [(m.name, m.checksum) for m in load_migrations("sqlite")]


async def test_the_dry_run_sql_run_by_hand_yields_the_migrated_schema(tmp_path: Path) -> None:
    by_hand, by_store = tmp_path / "by_hand.db", tmp_path / "by_store.db"
    store = SQLiteStore(str(by_hand))
    script = "\n".join(store.migration_sql(m) for m in load_migrations("sqlite"))
    await store.close()
    with sqlite3.connect(by_hand, isolation_level=None) as conn:
        conn.executescript(script)
    async with SQLiteStore(str(by_store)):
        pass

    def schema(path: Path) -> list[tuple[str, str]]:
        with sqlite3.connect(path) as conn:
            return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()

    assert schema(by_hand) == schema(by_store)
    assert versions(by_hand) == versions(by_store)
    async with open_store(file_url(by_hand, "auto_migrate=false")) as opened:
        await opened.ping()


def test_statements_split_at_semicolons_outside_strings_and_trigger_bodies() -> None:
    script = """
    -- a comment; with a semicolon
    CREATE TABLE t (a TEXT DEFAULT 'x;y');
    CREATE TRIGGER t_ai AFTER INSERT ON t BEGIN
        UPDATE t SET a = 'z;' WHERE rowid = new.rowid;
    END;
    -- trailing comment
    """
    statements = split_statements(script)
    assert len(statements) == 2
    assert statements[0].endswith("DEFAULT 'x;y');")
    assert statements[1].startswith("CREATE TRIGGER") and statements[1].endswith("END;")


def test_an_unterminated_statement_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="unterminated"):
        split_statements("CREATE TABLE t (a INTEGER);\nCREATE TABLE u (b INTEGER)")


# -- errors ------------------------------------------------------------------------------------


async def test_a_path_that_cannot_be_opened_is_unavailable_with_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "idem.db"
    store = open_store(file_url(missing))
    with pytest.raises(StoreUnavailableError, match="cannot open") as caught:
        await store.ping()
    assert str(missing) in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    await store.close()


async def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just some words that are long enough " * 40)
    with pytest.raises(StoreUnavailableError, match="not an SQLite database"):
        async with open_store(file_url(path)):
            pass


async def test_a_lock_held_past_busy_timeout_is_unavailable_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    async with open_store(file_url(path, "busy_timeout=0.1")) as store:
        with write_lock_held_elsewhere(path), pytest.raises(StoreUnavailableError, match="locked"):
            await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        # The failed write left no transaction open on the store's connection.
        assert (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired


async def test_a_write_cancelled_while_waiting_for_the_lock_leaves_the_store_usable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "idem.db"
    async with open_store(file_url(path, "busy_timeout=0.5")) as store:
        with write_lock_held_elsewhere(path):
            task = asyncio.create_task(store.reserve("k", "fp", lease_ttl=LONG, retention=LONG))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        reservation = await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        assert reservation.acquired
        assert reservation.lease is not None and reservation.lease.fence == 1


@pytest.fixture
async def patient_store(tmp_path: Path) -> AsyncIterator[tuple[Path, IdempotencyStore]]:
    """A connected store on a file, and the file: its busy_timeout outlasts any lock the test
    holds."""
    path = tmp_path / "idem.db"
    async with open_store(file_url(path, f"busy_timeout={LONG}")) as store:
        await store.ping()
        yield path, store


async def test_a_write_gets_a_lock_another_process_releases_within_busy_timeout(
    patient_store: tuple[Path, IdempotencyStore],
) -> None:
    path, store = patient_store
    # Held for several of SQLite's own (short) busy waits: the store must keep trying.
    with write_lock_held_elsewhere(path, for_seconds=0.3):
        assert (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired


async def test_a_cancelled_write_ends_before_the_other_process_lets_go_and_holds_no_lock(
    patient_store: tuple[Path, IdempotencyStore],
) -> None:
    path, store = patient_store
    # Generous: the cancellation must land long before this, not wait for it.
    with write_lock_held_elsewhere(path, for_seconds=3.0) as released:
        task = asyncio.create_task(store.reserve("k", "fp", lease_ttl=LONG, retention=LONG))
        await asyncio.sleep(0.05)  # the write is now waiting for the blocker's lock
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not released.is_set(), "the cancellation waited for the other process"
    # The cancelled write left no transaction open: another process takes the lock. (Not with
    # timeout=0: the cancelled statement may still be inside SQLite's busy wait on the driver's
    # thread, take the lock the blocker just let go and roll back a moment later; a leaked
    # transaction would hold it for ever.)
    other = sqlite3.connect(path, isolation_level=None, timeout=2.0)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired


async def test_a_closed_store_refuses_use_and_closes_again_quietly(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "idem.db"))
    await store.ping()
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("k")


# -- the local clock decides -------------------------------------------------------------------


async def test_the_injected_clock_decides_takeover(tmp_path: Path) -> None:
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        first = await store.reserve("k", "fp", lease_ttl=10, retention=LONG)
        assert first.lease is not None
        assert first.lease.lease_expires_at == clock.now + 10
        clock.advance(9.5)
        assert (await store.reserve("k", "fp", lease_ttl=10, retention=LONG)).outcome is (
            Outcome.IN_PROGRESS
        )
        clock.advance(1)
        second = await store.reserve("k", "fp", lease_ttl=10, retention=LONG)
        assert second.acquired and second.takeover
        assert second.lease is not None and second.lease.fence == 2


async def test_records_carry_the_injected_clocks_times(tmp_path: Path) -> None:
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        reservation = await store.reserve("k", "fp", lease_ttl=10, retention=100)
        assert reservation.lease is not None
        clock.advance(3)
        assert await store.complete(reservation.lease, b"ok", retention=50)
        record = await store.get("k")
    assert record is not None
    assert record.created_at == clock.now - 3
    assert record.expires_at == clock.now + 50
    assert record.lease_expires_at is None


async def test_a_key_past_retention_starts_over_continuing_the_fence(tmp_path: Path) -> None:
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        first = await store.reserve("k", "fp", lease_ttl=10, retention=20)
        assert first.lease is not None
        assert await store.complete(first.lease, b"old")
        clock.advance(21)
        assert await store.get("k") is None
        again = await store.reserve("k", "other-fp", lease_ttl=10, retention=20)
        assert again.acquired and not again.takeover
        assert again.lease is not None and again.lease.fence == 2
        record = await store.get("k")
        assert record is not None and record.response is None
        assert record.status is Status.IN_PROGRESS


async def test_delete_of_an_expired_record_reports_nothing_live(tmp_path: Path) -> None:
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        await store.reserve("k", "fp", lease_ttl=10, retention=20)
        clock.advance(21)
        assert await store.delete("k") is False


async def test_sweep_commits_each_bounded_batch_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "SWEEP_BATCH", 3)
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        for i in range(10):
            await store.reserve(f"old-{i}", "fp", lease_ttl=1, retention=5)
        await store.reserve("young", "fp", lease_ttl=1, retention=LONG)
        clock.advance(6)
        conn = await store._connect()
        begun: list[str] = []
        await conn.set_trace_callback(
            lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None
        )
        assert await store.sweep(limit=4) == 4
        assert len(begun) == 2  # batches of 3 and 1
        assert await store.sweep(limit=1000) == 6
        assert len(begun) == 2 + 3  # 3 + 3 + 0: a short batch ends the pass
        assert await store.get("young") is not None


async def on_each_statement(store: SQLiteStore, callback: Callable[[str], object]) -> None:
    """Run ``callback`` on the connection's thread as each statement of ``store`` starts."""
    for name in ("_connection", "_reader"):
        conn = getattr(store, name, None)
        if conn is not None:
            await conn.set_trace_callback(callback)


@pytest.mark.parametrize(
    "read",
    [lambda store: store.get("k"), lambda store: store.wait("k", timeout=0)],
    ids=["get", "wait"],
)
async def test_reads_judge_expiry_by_the_clock_after_the_read(
    tmp_path: Path, read: Callable[[SQLiteStore], Awaitable[Record | None]]
) -> None:
    clock = FakeClock()
    async with SQLiteStore(str(tmp_path / "idem.db"), clock=clock) as store:
        await store.reserve("k", "fp", lease_ttl=1, retention=1)
        assert await store.get("k") is not None
        # The record's retention ends while the read runs (as if the read had been held up).
        await on_each_statement(
            store, lambda sql: clock.advance(2) if sql.startswith("SELECT") else None
        )
        assert await read(store) is None


async def test_reads_answer_while_a_write_waits_for_another_processs_lock(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    # A short budget, so that without the fix the write gives up and the test fails quickly.
    async with open_store(file_url(path, "busy_timeout=3")) as store:
        assert (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired
        with write_lock_held_elsewhere(path):
            writer = asyncio.create_task(
                store.reserve("other", "fp", lease_ttl=LONG, retention=LONG)
            )
            await asyncio.sleep(0.05)  # the write is now waiting for the blocker's lock
            record = await store.get("k")
            waited = await store.wait("k", timeout=0.01)
            await store.ping()
            # All three answered while the write still waited.
            assert not writer.done()
        assert (await writer).acquired
    assert record is not None and record.status is Status.IN_PROGRESS
    assert waited is not None and waited.status is Status.IN_PROGRESS


# -- forged leases -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "forged",
    [
        {"key": "lone\ud800surrogate"},
        {"scope": "lone\ud800surrogate"},
        {"fence": 2**63},
        {"fence": -(2**63) - 1},
        {"token": "lone\ud800surrogate"},
        {"fence": "1"},
    ],
    ids=[
        "key-lone-surrogate",
        "scope-lone-surrogate",
        "fence-above-int64",
        "fence-below-int64",
        "token-lone-surrogate",
        "fence-not-int",
    ],
)
async def test_a_lease_no_row_could_hold_owns_nothing(
    tmp_path: Path, forged: dict[str, object]
) -> None:
    """No store issued such a lease: it fails the owner check like any other forged lease
    (the one rule of tests/contract/test_forged_leases.py), it is not an argument error."""
    async with SQLiteStore(str(tmp_path / "idem.db")) as store:
        lease = (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).lease
        assert lease is not None
        bad = dataclasses.replace(lease, **forged)  # type: ignore[arg-type]
        assert await store.complete(bad, b"x") is False
        assert await store.release(bad) is False
        assert await store.extend(bad, lease_ttl=LONG) is None
        # The real lease still owns the key.
        assert (await store.get("k")) is not None
        assert await store.complete(lease, b"done")


# -- several connections and processes on one file ---------------------------------------------


async def test_stores_on_one_file_acquire_a_key_exactly_once(sqlite_file_store_url: str) -> None:
    stores = [open_store(sqlite_file_store_url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                store.reserve("shared", "fp", lease_ttl=LONG, retention=LONG)
                for store in stores
                for _ in range(25)
            )
        )
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    outcomes = [r.outcome for r in results]
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 99


async def test_wait_sees_a_completion_made_through_another_connection(
    sqlite_file_store_url: str,
) -> None:
    async with (
        open_store(sqlite_file_store_url) as owner,
        open_store(sqlite_file_store_url) as waiter,
    ):
        lease = (await owner.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).lease
        assert lease is not None

        async def finish() -> None:
            await asyncio.sleep(0.1)
            await owner.complete(lease, b"done")

        finisher = asyncio.create_task(finish())
        record = await waiter.wait("k", timeout=10)
        await finisher
    assert record is not None and record.status is Status.COMPLETED
    assert record.response == b"done"


async def test_a_completed_record_survives_reopening_the_file(sqlite_file_store_url: str) -> None:
    async with open_store(sqlite_file_store_url) as store:
        lease = (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).lease
        assert lease is not None
        assert await store.complete(lease, b"kept")
    async with open_store(sqlite_file_store_url) as store:
        replay = await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None and replay.record.response == b"kept"


async def test_memory_stores_do_not_share_records() -> None:
    async with open_store("sqlite:///:memory:") as one, open_store("sqlite:///:memory:") as two:
        assert (await one.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired
        assert (await two.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired


# -- the CLI on a real file ----------------------------------------------------------------------


def test_inspect_prints_a_record_from_the_file(
    sqlite_file_store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def write() -> None:
        async with open_store(sqlite_file_store_url) as store:
            reservation = await store.reserve(
                "order-1", "fp", scope="alice", lease_ttl=5, retention=5
            )
            assert reservation.lease is not None
            await store.complete(reservation.lease, b'{"ok": true}')

    asyncio.run(write())
    assert main(["inspect", sqlite_file_store_url, "order-1", "--scope", "alice"]) == 0
    out = capsys.readouterr().out
    assert "completed" in out and '{"ok": true}' in out and "'alice'" in out


def test_sweep_command_removes_expired_records_from_the_file(
    sqlite_file_store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database = sqlite_file_store_url.removeprefix("sqlite:///")

    async def write_long_expired() -> None:
        # A store whose clock is an hour behind writes records that expired long ago.
        async with SQLiteStore(database, clock=lambda: time.time() - 3600) as past:
            for i in range(3):
                await past.reserve(f"old-{i}", "fp", lease_ttl=1, retention=10)

    asyncio.run(write_long_expired())
    assert main(["sweep", sqlite_file_store_url, "--limit", "2"]) == 0
    assert "swept 3 expired record(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_sweep_loop_stops_cleanly_on_sigterm(sqlite_file_store_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemstore", "sweep", sqlite_file_store_url, "--every", "0.2"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "swept 0 expired record(s)" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped; 0 record(s) swept in all" in out
    assert err == ""


async def test_closing_during_operations_fails_them_as_closed_not_with_driver_errors(
    sqlite_file_store_url: str,
) -> None:
    store = open_store(sqlite_file_store_url)
    await store.ping()
    calls = [store.reserve(f"k-{i}", "fp", lease_ttl=LONG, retention=LONG) for i in range(20)]
    tasks = [asyncio.ensure_future(call) for call in calls]
    await asyncio.sleep(0)
    await store.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures, "close() did not overtake any operation: the test proves nothing"
    assert all(isinstance(f, RuntimeError) and "closed" in str(f) for f in failures), failures


# -- issue 13: a blocked read inside wait, a response past SQLite's length limit -------------


def _lock_exclusively(path: Path) -> sqlite3.Connection:
    """Another connection that keeps an exclusive lock on the file until it is closed."""
    holder = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("COMMIT")
    return holder


async def test_wait_is_bounded_by_its_timeout_when_another_connection_locks_the_file(
    tmp_path: Path,
) -> None:
    """Every read inside wait gets only what is left of the timeout, not busy_timeout."""
    path = tmp_path / "idem.db"
    async with SQLiteStore(str(path)) as store:
        assert (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).acquired
    holder = _lock_exclusively(path)
    try:
        blocked = SQLiteStore(str(path), busy_timeout=5.0)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await blocked.wait("k", timeout=0.3)
        assert time.monotonic() - started < 1.5
        await blocked.close()
    finally:
        holder.close()


async def test_a_response_past_sqlites_length_limit_is_response_too_large(tmp_path: Path) -> None:
    """SQLITE_TOOBIG is the response's fault, not the engine's: ResponseTooLargeError, and the
    lease is still held, so the caller can release the key (not StoreUnavailableError, on
    which the runner keeps the key locked)."""
    async with SQLiteStore(str(tmp_path / "idem.db")) as store:
        lease = (await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)).lease
        assert lease is not None
        conn = await store._connect()
        # The engine's SQLITE_LIMIT_LENGTH, lowered so the test needs no gigabyte response.
        await conn._execute(conn._conn.setlimit, sqlite3.SQLITE_LIMIT_LENGTH, 100_000)
        with pytest.raises(ResponseTooLargeError):
            await store.complete(lease, b"x" * 200_000)
        assert await store.release(lease) is True
        again = await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        assert again.acquired and again.lease is not None and again.lease.fence == 2


async def _file_at_version(tmp_path: Path, count: int) -> Path:
    """A SQLite store file with only its first ``count`` migrations applied."""
    path = tmp_path / "idem.db"
    store = SQLiteStore(str(path))
    await store.apply_migrations(load_migrations("sqlite")[:count])
    await store.close()
    return path


def _write_as_older_code(path: Path, statement: str, rows: list[tuple[object, ...]]) -> None:
    """Rows written straight into the file, as the code of its version wrote them."""
    with contextlib.closing(sqlite3.connect(str(path))) as conn, conn:
        conn.executemany(statement, rows)


async def test_a_live_lease_written_before_version_2_keeps_its_record_after_the_upgrade(
    tmp_path: Path,
) -> None:
    """Older code let a record in progress expire before its lease: migration 0002 aligns such
    records, so the upgrade does not hand a held key to a second caller."""
    path = await _file_at_version(tmp_path, 1)
    now = time.time()
    _write_as_older_code(
        path,
        "INSERT INTO idemstore_records (scope, key, fingerprint, status, token, fence, "
        "created_at, expires_at, lease_expires_at) "
        "VALUES ('', 'k', 'fp', 'in_progress', 'old-token', 1, ?, ?, ?)",
        [(now - 10, now - 1, now + LONG)],
    )
    async with SQLiteStore(str(path)) as upgraded:
        second = await upgraded.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        assert second.outcome is Outcome.IN_PROGRESS
        assert second.record is not None and second.record.token == "old-token"


async def test_records_written_before_version_3_stay_readable_and_take_checkpoints(
    tmp_path: Path,
) -> None:
    """Migration 0003 adds the checkpoints column: records of version 2 (one completed, one
    held) read as before, with no checkpoints, and the held one records checkpoints."""
    path = await _file_at_version(tmp_path, 2)
    now = time.time()
    _write_as_older_code(
        path,
        "INSERT INTO idemstore_records (scope, key, fingerprint, status, token, fence, "
        "response, created_at, expires_at, lease_expires_at) "
        "VALUES ('', ?, 'fp', ?, ?, 1, ?, ?, ?, ?)",
        [
            ("done", "completed", "t-done", b"answer", now, now + LONG, None),
            ("held", "in_progress", "t-held", None, now, now + LONG, now + LONG),
        ],
    )
    async with SQLiteStore(str(path)) as upgraded:
        assert [name for name, _ in versions(path)][-1] == "0003_checkpoints.sql"
        replay = await upgraded.reserve("done", "fp", lease_ttl=LONG, retention=LONG)
        assert replay.record is not None and replay.record.response == b"answer"
        assert replay.record.checkpoints == ()
        held = Lease("", "held", "t-held", 1, now + LONG, LONG)
        assert await upgraded.checkpoint(held, "step", b"1") is True
        record = await upgraded.get("held")
        assert record is not None and record.checkpoints == (Checkpoint("step", b"1"),)


# -- issue 15: a write transaction is one call on the connection's thread ---------------------


async def test_a_reserve_cancelled_while_queued_on_the_connection_thread_commits_nothing(
    sqlite_file_store_url: str,
) -> None:
    """The whole transaction runs in one call on the thread; a caller cancelled before that
    call starts must not find its key claimed by a transaction nobody will ever hear of."""
    from idemstore.backends.sqlite.transactions import in_thread

    async with open_store(sqlite_file_store_url) as store:
        assert isinstance(store, SQLiteStore)
        await store.ping()
        conn = store._connection
        assert conn is not None
        gate = threading.Event()
        blocker = asyncio.ensure_future(in_thread(conn, lambda: gate.wait(10)))
        claim = asyncio.ensure_future(store.reserve("k", "fp", lease_ttl=LONG, retention=LONG))
        await asyncio.sleep(0.05)  # the reserve's transaction is queued behind the blocker
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        gate.set()
        await blocker
        assert await store.get("k") is None
        again = await store.reserve("k", "fp", lease_ttl=LONG, retention=LONG)
        assert again.outcome is Outcome.ACQUIRED and again.lease is not None
        assert again.lease.fence == 1
