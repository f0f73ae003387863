"""What the PostgreSQL backend promises beyond the contract suite: URL options, migrations,
the write-free replay, transaction-only advisory locks, races on the acquisition path,
LISTEN/NOTIFY with its polling fallback, batched sweeps, and failure mapping."""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest

from idemstore import (
    ConfigurationError,
    Outcome,
    SchemaError,
    Status,
    StoreUnavailableError,
    open_store,
)
from idemstore.backends.migrate import load_migrations
from idemstore.local_servers import free_port
from idemstore.local_servers.postgres import start_postgres
from idemstore.protocol import Checkpoint, Lease
from idemstore.testing.fixtures import running
from idemstore.testing.fixtures.postgres import drop_schema, migrate_schema, with_options

asyncpg = pytest.importorskip("asyncpg")

from idemstore.backends.postgres import PostgresStore  # noqa: E402
from idemstore.backends.postgres.reserving import KnownKeys  # noqa: E402
from idemstore.backends.postgres.statements import (  # noqa: E402
    COMPLETE,
    hash64,
    lock_keys,
    quote_ident,
    record_id,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from idemstore.local_servers.postgres import PostgresServer

SHORT = 0.3
SLACK = 0.25
LONG = 60.0
FP = "fp-a"


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


def schema_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["schema"][0]


def open_pg(url: str, **options: Any) -> PostgresStore:
    store = open_store(url, **options)
    assert isinstance(store, PostgresStore)
    return store


async def acquire(store: PostgresStore, key: str, *, lease_ttl: float = LONG) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=LONG)
    assert reservation.lease is not None
    return reservation.lease


@pytest.fixture
async def admin(postgres_server: str) -> AsyncIterator[Any]:
    """A direct connection to the test server, for looking behind the store's back."""
    connection = await asyncpg.connect(postgres_server)
    yield connection
    await connection.close()


# -- URL and options -------------------------------------------------------------------------


def test_url_options_configure_the_store() -> None:
    store = open_pg(
        "postgres://app:pw@db.example:5433/main?schema=idem&pool_min_size=2&pool_max_size=7"
        "&command_timeout=3&connect_timeout=1.5&statement_cache_size=0&sslmode=prefer"
    )
    assert store._schema == "idem"
    assert (store._pool_min_size, store._pool_max_size) == (2, 7)
    assert (store._command_timeout, store._connect_timeout) == (3.0, 1.5)
    assert store._statement_cache_size == 0
    # Connection parameters reach asyncpg; our own options do not.
    query = parse_qs(urlsplit(store._dsn).query)
    assert query["sslmode"] == ["prefer"]
    assert "schema" not in query and "pool_max_size" not in query


async def test_a_url_listing_several_hosts_reaches_the_first_that_answers(
    postgres_store_url: str,
) -> None:
    # libpq's host list, as in postgresql://u@primary:5432,standby:5432/db: the first host
    # here has nothing listening, so the store must go on to the second.
    parts = urlsplit(postgres_store_url)
    hosts = f"127.0.0.1:{free_port()},{parts.hostname}:{parts.port}"
    url = postgres_store_url.replace(parts.netloc, f"{parts.username}@{hosts}", 1)
    store = open_pg(f"{url}&target_session_attrs=read-write")
    assert hosts in store._dsn
    async with store:
        reservation = await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
        assert reservation.acquired


@pytest.mark.parametrize("hosts", ["h1:5432,h2:x", "h1:5432,:5433", "h1:5432,", "h1:5432,h2:99999"])
def test_a_host_list_with_a_host_or_port_missing_or_bad_is_a_configuration_error(
    hosts: str,
) -> None:
    with pytest.raises(ConfigurationError, match="host list") as caught:
        open_pg(f"postgresql://app:s3cret@{hosts}/db")
    assert "s3cret" not in str(caught.value)


def test_lock_keys_keep_scope_and_key_apart() -> None:
    assert hash64("public", "a:b", "c") != hash64("public", "a", "b:c")
    assert hash64("public", "", "k") != hash64("other", "", "k")
    assert -(2**63) <= hash64("public", "", "k") < 2**63


def test_a_stores_seeded_lock_keys_are_hash64_of_its_schema() -> None:
    # Every client of a schema must derive the same advisory lock key and NOTIFY payload for a
    # key, whichever way it computes them.
    for schema in ("public", "tenant ä", ""):
        lock_key = lock_keys(schema)
        for scope, key in (("", "k"), ("a:b", "c"), ("a", "b:c"), ("zoë", "🔑" * 40)):
            assert lock_key(scope, key) == hash64(schema, scope, key)


# -- migrations ------------------------------------------------------------------------------


async def test_an_unmigrated_schema_raises_schema_error_naming_migrate(
    postgres_server: str, postgres_schema: str
) -> None:
    url = with_options(postgres_server, schema=postgres_schema)
    store = open_pg(url)
    try:
        with pytest.raises(SchemaError, match="idemstore migrate") as caught:
            await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
    finally:
        await store.close()
    # The command it suggests names the same schema.
    assert f"schema={postgres_schema}" in str(caught.value)


async def test_a_store_opens_on_an_unmigrated_schema_so_it_can_be_migrated(
    postgres_server: str, postgres_schema: str
) -> None:
    async with open_pg(with_options(postgres_server, schema=postgres_schema)) as store:
        applied = await store.apply_migrations(load_migrations("postgres"))
        assert applied == load_migrations("postgres")
        assert await store.get(new_key()) is None


async def test_auto_migrate_applies_the_schema_on_first_use(
    postgres_server: str, postgres_schema: str
) -> None:
    url = with_options(postgres_server, schema=postgres_schema, auto_migrate="true")
    async with open_pg(url) as store:
        reservation = await store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG)
        assert reservation.outcome is Outcome.ACQUIRED
        applied = await store.applied_migrations()
    assert [m.name for m in applied] == [m.name for m in load_migrations("postgres")]


async def test_applied_migrations_is_empty_before_and_complete_after(
    postgres_server: str, postgres_schema: str
) -> None:
    store = open_pg(with_options(postgres_server, schema=postgres_schema))
    try:
        available = load_migrations("postgres")
        assert await store.applied_migrations() == []
        assert await store.apply_migrations(available) == available
        applied = await store.applied_migrations()
        assert [(m.name, m.checksum) for m in applied] == [(m.name, m.checksum) for m in available]
        assert await store.apply_migrations(available) == []
    finally:
        await store.close()


def test_migration_sql_puts_the_quoted_schema_in_place() -> None:
    store = open_pg("postgresql://localhost/db?schema=Tenant_7")
    (first, *_) = load_migrations("postgres")
    sql = store.migration_sql(first)
    assert "{{schema}}" not in sql
    assert 'CREATE TABLE "Tenant_7".idemstore_records' in sql


async def test_racing_migrators_apply_each_migration_once(
    postgres_server: str, postgres_schema: str
) -> None:
    url = with_options(postgres_server, schema=postgres_schema)
    stores = [open_pg(url, pool_min_size=0, pool_max_size=1) for _ in range(4)]
    available = load_migrations("postgres")
    try:
        results = await asyncio.gather(*(s.apply_migrations(available) for s in stores))
        applied_by_anyone = sorted(m.name for result in results for m in result)
        assert applied_by_anyone == [m.name for m in available]
        assert [m.name for m in await stores[0].applied_migrations()] == applied_by_anyone
    finally:
        for store in stores:
            await store.close()


async def test_a_schema_dropped_under_a_running_store_raises_schema_error(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url) as store:
        await admin.execute(f'DROP SCHEMA "{schema_of(postgres_store_url)}" CASCADE')
        with pytest.raises(SchemaError, match="idemstore migrate"):
            await store.get(new_key())


async def test_schemas_keep_their_records_apart(
    postgres_server: str, postgres_store_url: str
) -> None:
    other_schema = f"Other_{uuid.uuid4().hex[:8]}"
    other_url = with_options(postgres_server, schema=other_schema)
    await migrate_schema(other_url)
    try:
        key = new_key()
        async with open_pg(postgres_store_url) as one, open_pg(other_url) as two:
            await one.complete(await acquire(one, key), b"one")
            assert await two.get(key) is None
            mine = await two.reserve(key, "other-fp", lease_ttl=LONG, retention=LONG)
            assert mine.outcome is Outcome.ACQUIRED
    finally:
        await drop_schema(postgres_server, other_schema)


# -- the hot path ---------------------------------------------------------------------------


async def _write_counters(admin: Any, schema: str) -> tuple[int, int, int]:
    row = await admin.fetchrow(
        "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
        "WHERE relid = $1::regclass",
        f'"{schema}".idemstore_records',
    )
    return (row[0], row[1], row[2])


# A key the store saw exist takes the one-statement reserve (RESERVE_KNOWN); any other key the
# plain INSERT and then the read (RESERVE, RESERVE_READ). Tests of the reserve path run both.
SEEN_BY = ["this store", "another store"]


@pytest.mark.parametrize("claimed_by", SEEN_BY)
async def test_a_replay_writes_nothing(
    postgres_store_url: str, admin: Any, claimed_by: str
) -> None:
    schema = schema_of(postgres_store_url)
    # One pooled connection: the backend whose statistics we flush is the one that replays.
    async with open_pg(postgres_store_url, pool_min_size=1, pool_max_size=1) as store:
        key = new_key()
        if claimed_by == "this store":
            await store.complete(await acquire(store, key), b"result")
        else:
            async with open_pg(postgres_store_url) as other:
                await other.complete(await acquire(other, key), b"result")

        async def flushed_counters() -> tuple[int, int, int]:
            assert store._connection is not None
            await store._connection.fetchval("SELECT pg_stat_force_next_flush()")
            return await _write_counters(admin, schema)

        before = await flushed_counters()
        for _ in range(20):
            replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
            assert replay.outcome is Outcome.COMPLETED
            assert replay.record is not None and replay.record.response == b"result"
        after_replays = await flushed_counters()
        # The same measurement sees a write when there is one.
        await acquire(store, new_key())
        after_write = await flushed_counters()
    assert after_replays == before
    assert after_write == (before[0] + 1, before[1], before[2])


@pytest.mark.parametrize("seen_before", [False, True])
async def test_a_reserve_that_waited_on_a_first_claim_answers_in_progress(
    postgres_store_url: str, admin: Any, seen_before: bool
) -> None:
    # The claim commits while the reserve's INSERT waits for it: the INSERT then inserts
    # nothing, and the answer must come from a look at the committed row (the plain INSERT's
    # read, or, on the one-statement path whose read cannot see it, the function's), not from
    # an empty result.
    schema = schema_of(postgres_store_url)
    key = new_key()
    async with open_pg(postgres_store_url) as store:
        if seen_before:  # the store claimed the key once; it was deleted since
            await acquire(store, key)
            assert await store.delete(key)
        claim = admin.transaction()
        await claim.start()
        row = await admin.fetchrow(
            f"SELECT * FROM {quote_ident(schema)}.idemstore_reserve($1, '', $2, $3, $4, $5, $6)",
            hash64(schema, "", key),
            key,
            FP,
            "first-claim-token",
            LONG,
            LONG,
        )
        assert row["outcome"] == "acquired"
        waiting = asyncio.create_task(store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        await _until_one_waits_on_a_lock(admin)
        assert not waiting.done()
        await claim.commit()
        reservation = await asyncio.wait_for(waiting, LONG)
    assert reservation.outcome is Outcome.IN_PROGRESS
    assert reservation.record is not None
    assert reservation.record.token == "first-claim-token"


def test_known_keys_forget_the_oldest_past_their_limit() -> None:
    known = KnownKeys(limit=3)
    for row_id in (b"a", b"b", b"c", b"a", b"d"):  # a second add of b"a" does not refresh it
        known.add(row_id)
    assert [row_id in known for row_id in (b"a", b"b", b"c", b"d")] == [False, True, True, True]


async def test_a_key_seen_by_one_store_is_answered_alike_by_another(
    postgres_store_url: str,
) -> None:
    # Each state of a row, answered through both reserve paths: the store that made it (its
    # one-statement path) and a store that never saw the key (INSERT, then the read).
    async with open_pg(postgres_store_url) as maker:
        completed, running, released, lapsed = (new_key() for _ in range(4))
        await maker.complete(await acquire(maker, completed), b"done")
        running_lease = await acquire(maker, running)
        assert await maker.release(await acquire(maker, released))
        await acquire(maker, lapsed, lease_ttl=SHORT)
        await asyncio.sleep(SHORT + SLACK)

        async def answers(store: PostgresStore) -> list[tuple[Outcome, int | None, bool]]:
            seen = []
            for key, fingerprint in [
                (completed, FP),
                (completed, "other-fp"),
                (running, FP),
                (running, "other-fp"),
            ]:
                found = await store.reserve(key, fingerprint, lease_ttl=LONG, retention=LONG)
                assert found.record is not None
                seen.append((found.outcome, found.record.fence, found.takeover))
            return seen

        async with open_pg(postgres_store_url) as stranger:
            assert await answers(stranger) == await answers(maker)
            assert await answers(maker) == [
                (Outcome.COMPLETED, 1, False),
                (Outcome.MISMATCH, 1, False),
                (Outcome.IN_PROGRESS, running_lease.fence, False),
                (Outcome.MISMATCH, running_lease.fence, False),
            ]
            # A released key and a lapsed lease are taken, by either path, with the next fence.
            again = await stranger.reserve(released, FP, lease_ttl=LONG, retention=LONG)
            assert again.outcome is Outcome.ACQUIRED and again.lease is not None
            assert again.lease.fence == 2 and not again.takeover
            taken = await maker.reserve(lapsed, FP, lease_ttl=LONG, retention=LONG)
            assert taken.outcome is Outcome.ACQUIRED and taken.lease is not None
            assert taken.lease.fence == 2 and taken.takeover


async def _until_one_waits_on_a_lock(admin: Any) -> None:
    for _ in range(200):
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no session waited on the uncommitted first claim")


async def test_no_advisory_lock_outlives_an_operation(postgres_store_url: str, admin: Any) -> None:
    async with open_pg(postgres_store_url) as store:
        keys = [new_key() for _ in range(10)]
        leases = await asyncio.gather(*(acquire(store, k, lease_ttl=SHORT) for k in keys))
        await asyncio.sleep(SHORT + SLACK)
        await asyncio.gather(*(store.reserve(k, FP, lease_ttl=LONG, retention=LONG) for k in keys))
        await asyncio.gather(*(store.complete(lease, b"late") for lease in leases))
        held = await admin.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    assert held == 0


async def test_concurrent_takeovers_of_a_lapsed_lease_acquire_once(
    postgres_store_url: str,
) -> None:
    async with open_pg(postgres_store_url) as store:
        key = new_key()
        first = await acquire(store, key, lease_ttl=SHORT)
        await asyncio.sleep(SHORT + SLACK)
        results = await asyncio.gather(
            *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(40))
        )
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert winners[0].takeover is True
    assert winners[0].lease is not None and winners[0].lease.fence == first.fence + 1
    assert all(r.outcome is Outcome.IN_PROGRESS for r in results if not r.acquired)


async def test_concurrent_reclaims_after_release_acquire_once(postgres_store_url: str) -> None:
    async with open_pg(postgres_store_url) as store:
        key = new_key()
        first = await acquire(store, key)
        assert await store.release(first)
        results = await asyncio.gather(
            *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(40))
        )
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert winners[0].takeover is False
    assert winners[0].lease is not None and winners[0].lease.fence == first.fence + 1


async def test_concurrent_reserves_past_retention_acquire_once_and_continue_the_fence(
    postgres_store_url: str,
) -> None:
    async with open_pg(postgres_store_url) as store:
        key = new_key()
        first = await store.reserve(key, FP, lease_ttl=SHORT, retention=SHORT)
        assert first.lease is not None
        await store.complete(first.lease, b"old")
        await asyncio.sleep(SHORT + SLACK)
        results = await asyncio.gather(
            *(store.reserve(key, "new-fp", lease_ttl=LONG, retention=LONG) for _ in range(40))
        )
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert winners[0].lease is not None and winners[0].lease.fence == first.lease.fence + 1
    assert all(r.outcome is Outcome.IN_PROGRESS for r in results if not r.acquired)


async def test_a_late_complete_racing_takeovers_has_one_winner(postgres_store_url: str) -> None:
    async with open_pg(postgres_store_url) as store:
        key = new_key()
        stale = await acquire(store, key, lease_ttl=SHORT)
        await asyncio.sleep(SHORT + SLACK)
        completed, *reservations = await asyncio.gather(
            store.complete(stale, b"late"),
            *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(20)),
        )
        final = await store.get(key)
    winners = [r for r in reservations if r.acquired]
    assert final is not None
    if completed:
        assert winners == []
        assert final.status is Status.COMPLETED and final.response == b"late"
    else:
        assert len(winners) == 1 and winners[0].takeover
        assert final.status is Status.IN_PROGRESS
        assert winners[0].lease is not None and final.token == winners[0].lease.token


async def test_a_released_key_stays_as_a_tombstone_until_retention_ends(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url) as store:
        key = new_key()
        assert await store.release(await acquire(store, key))
        assert await store.get(key) is None
        rows = await admin.fetchval(
            f'SELECT count(*) FROM "{schema_of(postgres_store_url)}".idemstore_records '
            "WHERE key = $1 AND released",
            key,
        )
        assert rows == 1
        assert await store.sweep() == 0


async def test_lease_times_are_the_database_clock_plus_the_durations(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url) as store:
        before = await admin.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        key = new_key()
        lease = await acquire(store, key, lease_ttl=30)
        after = await admin.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        record = await store.get(key)
    assert record is not None
    assert before <= record.created_at <= after
    assert lease.lease_expires_at == record.lease_expires_at
    assert record.lease_expires_at == pytest.approx(record.created_at + 30, abs=1e-5)
    assert record.expires_at == pytest.approx(record.created_at + LONG, abs=1e-5)


# -- sweep ----------------------------------------------------------------------------------


async def test_sweep_removes_up_to_the_limit_across_batches(postgres_store_url: str) -> None:
    async with open_pg(postgres_store_url, sweep_batch_size=2) as store:
        for _ in range(7):
            reservation = await store.reserve(new_key(), FP, lease_ttl=SHORT, retention=SHORT)
            assert reservation.lease is not None
        live = await acquire(store, new_key())
        await asyncio.sleep(SHORT + SLACK)
        assert await store.sweep(limit=3) == 3
        assert await store.sweep(limit=1000) == 4
        assert await store.sweep(limit=1000) == 0
        assert await store.get(live.key) is not None


async def test_complete_is_a_heap_only_update(postgres_store_url: str, admin: Any) -> None:
    """complete restarts retention (it rewrites expires_at); with no index on that column
    (migration 0006) the row's new version is heap-only: no index entry is written. The store's
    statement runs in a transaction of ours, whose own counters PostgreSQL reports at once."""
    schema = schema_of(postgres_store_url)
    table = f"{quote_ident(schema)}.idemstore_records"
    async with open_pg(postgres_store_url) as store:
        lease = await acquire(store, new_key())
    async with admin.transaction():
        completed = await admin.fetchval(
            COMPLETE.format(s=quote_ident(schema)),
            record_id("", lease.key),
            lease.token,
            lease.fence,
            b"result",
            LONG,
            "idemstore_test",
            0,
        )
        counts = await admin.fetchrow(
            "SELECT pg_stat_get_xact_tuples_updated($1::regclass),"
            " pg_stat_get_xact_tuples_hot_updated($1::regclass)",
            table,
        )
    assert completed is True
    assert tuple(counts) == (1, 1)


# -- wait -----------------------------------------------------------------------------------


async def _listener_pids(admin: Any, channel: str) -> list[int]:
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity "
        "WHERE application_name = 'idemstore-listener' AND query LIKE $1",
        f'LISTEN "{channel}"%',
    )
    return [row[0] for row in rows]


async def _until(condition: Any, timeout: float = 10.0) -> Any:
    """Poll an async condition until it is truthy (the server's view lags the client's)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await condition()
        if value or loop.time() > deadline:
            return value
        await asyncio.sleep(0.02)


async def test_waiters_share_one_dedicated_listener_connection(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url) as store:
        leases = [await acquire(store, new_key()) for _ in range(3)]
        waiters = [asyncio.create_task(store.wait(x.key, timeout=30)) for x in leases]
        pids = await _until(lambda: _listener_pids(admin, store._channel))
        for lease in leases:
            assert await store.complete(lease, b"done")
        records = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert len(pids) == 1
    assert [r.status for r in records] == [Status.COMPLETED] * 3


async def test_wait_still_wakes_after_the_listener_connection_drops(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url) as store:
        lease = await acquire(store, new_key())
        waiter = asyncio.create_task(store.wait(lease.key, timeout=30))
        (pid,) = await _until(lambda: _listener_pids(admin, store._channel))
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        await _until(lambda: asyncio.sleep(0, not store._listener.up))
        assert await store.complete(lease, b"done")
        record = await asyncio.wait_for(waiter, 10)
    assert record is not None and record.response == b"done"


async def test_wait_polls_when_listening_is_off(postgres_store_url: str, admin: Any) -> None:
    async with open_pg(postgres_store_url, listen="false") as store:
        lease = await acquire(store, new_key())
        waiter = asyncio.create_task(store.wait(lease.key, timeout=30))
        await asyncio.sleep(0.1)
        assert await _listener_pids(admin, store._channel) == []
        assert await store.release(lease)
        assert await asyncio.wait_for(waiter, 10) is None


# -- failures -------------------------------------------------------------------------------


async def test_an_unreachable_server_is_unavailable_and_the_password_stays_hidden() -> None:
    url = f"postgresql://app:s3cret@127.0.0.1:{free_port()}/db?connect_timeout=2"
    store = open_pg(url)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.get(new_key())
    finally:
        await store.close()
    assert "s3cret" not in str(caught.value)
    assert caught.value.__cause__ is not None


async def test_a_command_timeout_is_unavailable_and_the_store_carries_on(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url, command_timeout=0.3) as store:
        lease = await acquire(store, new_key())
        schema = schema_of(postgres_store_url)
        # Another session holds the row lock, so complete cannot finish in time.
        blocker = admin.transaction()
        await blocker.start()
        await admin.execute(
            f'SELECT 1 FROM "{schema}".idemstore_records WHERE key = $1 FOR UPDATE', lease.key
        )
        try:
            with pytest.raises(StoreUnavailableError):
                await store.complete(lease, b"blocked")
        finally:
            await blocker.rollback()
        assert await store.complete(lease, b"done") is True


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this module's own, so restarting it disturbs no other test."""
    with running("postgres", start_postgres) as server:
        yield server


@pytest.mark.slow
async def test_a_restart_is_unavailable_until_the_server_returns_then_the_pool_recovers(
    own_postgres: PostgresServer,
) -> None:
    url = with_options(
        own_postgres.url, auto_migrate="true", connect_timeout="2", pool_min_size="2"
    )
    async with open_pg(url) as store:
        lease = await acquire(store, new_key())
        await asyncio.to_thread(own_postgres.stop_process)
        with pytest.raises(StoreUnavailableError):
            await store.get(lease.key)
        await asyncio.to_thread(own_postgres.start)
        failures: list[BaseException] = []
        for _ in range(50):
            try:
                record = await store.get(lease.key)
                break
            except StoreUnavailableError as exc:
                failures.append(exc)
                await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the store did not recover: {failures[-1]}")
        assert record is not None and record.token == lease.token
        assert await store.complete(lease, b"after restart") is True


@pytest.mark.slow
async def test_a_committed_completion_survives_an_immediate_shutdown(
    own_postgres: PostgresServer,
) -> None:
    url = with_options(own_postgres.url, auto_migrate="true", connect_timeout="2")
    key = new_key()
    async with open_pg(url) as store:
        assert await store.complete(await acquire(store, key), b"durable")
    # Immediate shutdown skips the checkpoint: the record comes back from the WAL.
    await asyncio.to_thread(own_postgres.stop_process, mode="immediate")
    await asyncio.to_thread(own_postgres.start)
    async with open_pg(url) as store:
        record = await store.get(key)
    assert record is not None and record.response == b"durable"


async def test_a_role_owning_a_precreated_schema_can_migrate_without_database_create(
    postgres_server: str,
) -> None:
    import asyncpg

    from idemstore import open_store

    schema = f"owned_{uuid.uuid4().hex[:10]}"
    role = f"r_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(postgres_server)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'REVOKE CREATE ON DATABASE postgres FROM "{role}"')
        await admin.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"')
        parts = urlsplit(postgres_server)
        url = f"postgresql://{role}@{parts.hostname}:{parts.port}{parts.path}?schema={schema}"
        store = open_store(url)
        try:
            applied = await store.apply_migrations(load_migrations("postgres"))  # type: ignore[attr-defined]
            assert [m.name for m in applied] == [m.name for m in load_migrations("postgres")]
        finally:
            await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


# -- issue 13: wait bounded by its timeout, the digest-keyed schema (0002) ---------------------


async def _lock_the_table(admin: Any, url: str) -> Any:
    """Another session takes the records table's ACCESS EXCLUSIVE lock (as a migration does),
    so every read of it blocks until that transaction ends."""
    blocker = admin.transaction()
    await blocker.start()
    await admin.execute(f'LOCK TABLE "{schema_of(url)}".idemstore_records IN ACCESS EXCLUSIVE MODE')
    return blocker


async def test_wait_whose_first_read_blocks_fails_within_its_timeout_not_the_command_timeout(
    postgres_store_url: str, admin: Any
) -> None:
    async with open_pg(postgres_store_url, command_timeout=4) as store:
        key = new_key()
        await acquire(store, key)
        blocker = await _lock_the_table(admin, postgres_store_url)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(StoreUnavailableError, match="did not answer in time"):
                await store.wait(key, timeout=0.3)
            assert asyncio.get_running_loop().time() - started < 1.5
        finally:
            await blocker.rollback()
        # The store carries on: the cut-off read cost nothing but its connection's query.
        record = await store.get(key)
        assert record is not None and record.status is Status.IN_PROGRESS


async def test_wait_whose_later_read_blocks_returns_the_last_record_at_its_timeout(
    postgres_store_url: str, admin: Any
) -> None:
    # Polling, so the loop reads again while the table is locked.
    async with open_pg(postgres_store_url, command_timeout=4, listen=False) as store:
        key = new_key()
        lease = await acquire(store, key)
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.create_task(store.wait(key, timeout=0.8))
        await asyncio.sleep(0.15)
        blocker = await _lock_the_table(admin, postgres_store_url)
        try:
            record = await waiting
            assert loop.time() - started < 2.0
        finally:
            await blocker.rollback()
        assert record is not None and record.token == lease.token
        assert record.status is Status.IN_PROGRESS


async def _store_migrated_to(url: str, count: int) -> PostgresStore:
    store = open_pg(url)
    await store.apply_migrations(load_migrations("postgres")[:count])
    return store


def _function_calls(schema: str) -> dict[str, str]:
    """reserve, complete and release as the code of schema versions 1 to 4 sent them: a call
    of each server-side function (newer code sends some of them as plain statements)."""
    s = quote_ident(schema)
    return {
        "reserve": f"SELECT * FROM {s}.idemstore_reserve($1, $2, $3, $4, $5, $6, $7)",
        "complete": f"SELECT {s}.idemstore_complete($1, $2, $3, $4, $5, $6, $7, $8)",
        "release": f"SELECT {s}.idemstore_release($1, $2, $3, $4, $5, $6)",
    }


async def _records_at(url: str, schema: str, version: int, *, held_ttl: float = LONG) -> Any:
    """A store migrated to schema ``version`` (3 or 4) with records written as that version's
    code wrote them: "done" completed with b"old result", "gone" released, and "held" still
    in progress under a ``held_ttl`` lease, whose reserve row this returns."""
    old = await _store_migrated_to(url, version)
    try:
        sql = _function_calls(schema)
        pool = await old._connect()

        async def reserve(key: str, lease_ttl: float = LONG) -> Any:
            return await pool.fetchrow(
                sql["reserve"], hash64(schema, "", key), "", key, FP,
                uuid.uuid4().hex, lease_ttl, LONG,
            )  # fmt: skip

        done = await reserve("done")
        assert await pool.fetchval(
            sql["complete"], "", "done", done["token"], done["fence"], b"old result", LONG,
            "c", 0,
        )  # fmt: skip
        held = await reserve("held", lease_ttl=held_ttl)
        gone = await reserve("gone")
        assert await pool.fetchval(sql["release"], "", "gone", gone["token"], 1, "c", 0)
    finally:
        await old.close()
    return held


async def test_records_written_under_schema_version_1_replay_after_version_2(
    postgres_server: str, postgres_schema: str, admin: Any
) -> None:
    """The first real schema upgrade: a store at 0001 with records in every state (completed,
    in progress, released, and one whose retention is shorter than its lease) is migrated to
    0002 and answers for each of them exactly as before."""
    url = with_options(postgres_server, schema=postgres_schema)
    old = await _store_migrated_to(url, 1)
    try:
        assert [m.name for m in await old.applied_migrations()] == ["0001_records.sql"]
        # The 0001 functions, called as the code of that version did.
        sql = _function_calls(postgres_schema)
        pool = await old._connect()

        async def reserve_v1(key: str, lease_ttl: float, retention: float) -> Any:
            return await pool.fetchrow(
                sql["reserve"],
                hash64(postgres_schema, "", key),
                "",
                key,
                FP,
                uuid.uuid4().hex,
                lease_ttl,
                retention,
            )

        done = await reserve_v1("done", LONG, LONG)
        assert await pool.fetchval(
            sql["complete"],
            "",
            "done",
            done["token"],
            done["fence"],
            b"old result",
            LONG,
            "c",
            0,
        )
        held = await reserve_v1("held", LONG, LONG)
        gone = await reserve_v1("gone", LONG, LONG)
        assert await pool.fetchval(sql["release"], "", "gone", gone["token"], 1, "c", 0)
        short = await reserve_v1("short", LONG, SHORT)
    finally:
        await old.close()
    await asyncio.sleep(SHORT + SLACK)

    async with open_pg(url) as new:
        with pytest.raises(SchemaError):
            await new.get("done")
        applied = await new.apply_migrations(load_migrations("postgres"))
        assert [m.name for m in applied] == [
            "0002_digest_key.sql",
            "0003_watched_rows.sql",
            "0004_identity_digest_once.sql",
            "0005_checkpoints.sql",
            "0006_heap_order_sweep.sql",
        ]
        replay = await new.reserve("done", FP, lease_ttl=LONG, retention=LONG)
        assert replay.outcome is Outcome.COMPLETED
        assert replay.record is not None and replay.record.response == b"old result"
        busy = await new.reserve("held", FP, lease_ttl=LONG, retention=LONG)
        assert busy.outcome is Outcome.IN_PROGRESS
        assert busy.record is not None and busy.record.token == held["token"]
        # The holder of a version-1 lease still owns it.
        lease = Lease("", "held", held["token"], held["fence"], 0.0, LONG)
        assert await new.extend(lease, lease_ttl=LONG) is not None
        assert await new.complete(lease, b"finished after the upgrade") is True
        # The released key continues its fence.
        again = await new.reserve("gone", FP, lease_ttl=LONG, retention=LONG)
        assert again.lease is not None and again.lease.fence == 2
        # The record whose retention was shorter than its live lease was kept alive.
        kept = await new.reserve("short", FP, lease_ttl=LONG, retention=LONG)
        assert kept.outcome is Outcome.IN_PROGRESS
        assert kept.record is not None and kept.record.token == short["token"]
        columns = await admin.fetch(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = $1::regclass AND i.indisprimary",
            f'"{postgres_schema}".idemstore_records',
        )
        assert [row[0] for row in columns] == ["id"]


async def test_records_written_under_schema_version_3_replay_after_version_4(
    postgres_server: str, postgres_schema: str, admin: Any
) -> None:
    """0004 turns the generated id into a plain column that reserve fills: records written
    before it (completed, in progress, released) answer exactly as before, and a row
    written after it carries the same digest the generated column computed."""
    url = with_options(postgres_server, schema=postgres_schema)
    held = await _records_at(url, postgres_schema, 3)

    async with open_pg(url) as new:
        applied = await new.apply_migrations(load_migrations("postgres"))
        assert [m.name for m in applied] == [
            "0004_identity_digest_once.sql",
            "0005_checkpoints.sql",
            "0006_heap_order_sweep.sql",
        ]
        replay = await new.reserve("done", FP, lease_ttl=LONG, retention=LONG)
        assert replay.record is not None and replay.record.response == b"old result"
        busy = await new.reserve("held", FP, lease_ttl=LONG, retention=LONG)
        assert busy.outcome is Outcome.IN_PROGRESS
        lease = Lease("", "held", held["token"], held["fence"], 0.0, LONG)
        assert await new.complete(lease, b"finished after the upgrade") is True
        again = await new.reserve("gone", FP, lease_ttl=LONG, retention=LONG)
        assert again.lease is not None and again.lease.fence == 2
        fresh = await new.reserve("new:é", FP, scope="s", lease_ttl=LONG, retention=LONG)
        assert fresh.lease is not None
    table = f'"{postgres_schema}".idemstore_records'
    ids = {
        (row["scope"], row["key"]): bytes(row["id"])
        for row in await admin.fetch(f"SELECT scope, key, id FROM {table}")
    }
    for (scope, key), digest in ids.items():
        assert digest == hashlib.sha256(f"{scope}\0{key}".encode()).digest()
    assert ("s", "new:é") in ids and len(ids) == 4
    generated = await admin.fetchval(
        "SELECT attgenerated = 's' FROM pg_attribute"
        " WHERE attrelid = $1::regclass AND attname = 'id'",
        table,
    )
    assert generated is False


async def test_records_written_under_schema_version_4_read_and_take_checkpoints_after_5(
    postgres_server: str, postgres_schema: str
) -> None:
    """0005 adds the checkpoints column and the functions that read and append it: records
    written before it (completed, in progress, released) answer as before, with no
    checkpoints, and the one in progress records checkpoints that a takeover then sees."""
    url = with_options(postgres_server, schema=postgres_schema)
    held = await _records_at(url, postgres_schema, 4, held_ttl=1.0)

    async with open_pg(url) as new:
        applied = await new.apply_migrations(load_migrations("postgres"))
        assert [m.name for m in applied] == ["0005_checkpoints.sql", "0006_heap_order_sweep.sql"]
        replay = await new.reserve("done", FP, lease_ttl=LONG, retention=LONG)
        assert replay.record is not None and replay.record.response == b"old result"
        assert replay.record.checkpoints == ()
        lease = Lease("", "held", held["token"], held["fence"], 0.0, LONG)
        assert await new.checkpoint(lease, "step", b"1") is True
        record = await new.get("held")
        assert record is not None and record.checkpoints == (Checkpoint("step", b"1"),)
        await asyncio.sleep(1.3)  # the old owner's one-second lease lapses
        taken = await new.reserve("held", FP, lease_ttl=LONG, retention=LONG)
        assert taken.takeover is True and taken.checkpoints == (Checkpoint("step", b"1"),)
        again = await new.reserve("gone", FP, lease_ttl=LONG, retention=LONG)
        assert again.lease is not None and again.lease.fence == 2 and again.checkpoints == ()


async def test_the_longest_identity_is_stored_through_pgbouncer(pgbouncer_store_url: str) -> None:
    """3 KB of UTF-8 identity (1,024 CJK characters of scope, 255 of key) exceeded the
    b-tree row limit of version 1's primary key; through transaction pooling too."""
    rng = random.Random(13)
    # Random ideographs: PostgreSQL compresses index entries, so a repeated one would fit.
    scope = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(1024))
    key = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(255))
    async with open_store(pgbouncer_store_url) as store:
        first = await store.reserve(key, FP, scope=scope, lease_ttl=LONG, retention=LONG)
        assert first.lease is not None
        assert await store.complete(first.lease, b"ok") is True
        replay = await store.reserve(key, FP, scope=scope, lease_ttl=LONG, retention=LONG)
        assert replay.outcome is Outcome.COMPLETED


# -- issue 15: a NOTIFY only where a waiter can exist ------------------------------------------


@pytest.mark.parametrize(
    ("scope", "key"),
    [("", "k"), ("tenant", "clé-ünïcode-🔑"), ("s\u00e9", "x" * 5000)],
)
async def test_the_client_row_id_is_the_one_the_functions_compute(
    postgres_store_url: str, postgres_server: str, scope: str, key: str
) -> None:
    """A fresh reserve and complete find the row by an id the client computes; replays and
    takeovers by the one idemstore_id computes. Were they to differ, a key would get two rows."""
    connection = await asyncpg.connect(postgres_server)
    async with open_pg(postgres_store_url) as store:
        try:
            await store.ping()
            server_id = await connection.fetchval(
                f"SELECT {schema_of(postgres_store_url)}.idemstore_id($1, $2)", scope, key
            )
        finally:
            await connection.close()
    assert record_id(scope, key) == server_id


async def test_complete_notifies_only_keys_a_wait_has_seen_in_progress(
    postgres_store_url: str, postgres_server: str
) -> None:
    """pg_notify serialises commits server-wide: a complete nobody waits for must not send
    one, and a complete somebody waits for must, or the wait would sleep until it polls."""
    heard: list[str] = []
    listener = await asyncpg.connect(postgres_server)
    async with open_pg(postgres_store_url) as store:
        try:
            await listener.add_listener(store._channel, lambda *args: heard.append(args[-1]))
            unwatched = await acquire(store, "unwatched")
            assert await store.complete(unwatched, b"done")
            gone = await acquire(store, "released")
            assert await store.release(gone)
            await listener.execute("SELECT 1")  # notifications arrive before this answer
            await asyncio.sleep(0.05)
            assert heard == []

            watched = await acquire(store, "watched")
            waiting = asyncio.ensure_future(store.wait("watched", timeout=30))
            marked = (
                f"SELECT watched FROM {schema_of(postgres_store_url)}.idemstore_records"
                " WHERE key = 'watched'"
            )
            for _ in range(500):  # the wait marks the row before it sleeps
                if await listener.fetchval(marked):
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the wait never marked the row watched")
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await store.complete(watched, b"done")
            record = await asyncio.wait_for(waiting, 5)
            # Woken by the notification, long before the wait would have looked again.
            assert loop.time() - started < 0.5
            assert record is not None and record.response == b"done"
            await listener.execute("SELECT 1")
            assert heard == [str(store._lock_key("", "watched"))]
        finally:
            await listener.close()
