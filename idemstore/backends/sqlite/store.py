"""``sqlite:///path/to/file.db``: records in one SQLite file that several processes on one host
may share (WAL mode), or ``sqlite:///:memory:`` for one store object in one process.

Every write runs in ``BEGIN IMMEDIATE``, which takes SQLite's single write lock up front, so a
transaction never has to upgrade a stale read snapshot and never fails half-way for lock reasons.
While another process holds that lock, SQLite itself waits only briefly (``BUSY_ATTEMPT``) and the
store retries from asyncio until ``busy_timeout`` runs out, so a cancelled operation ends within
one short attempt instead of sitting in SQLite's busy handler for the whole budget. The local
clock decides leases and is read only once the write lock is held, so deadlines are written in
commit order.

A file store reads through a second connection: WAL readers never need the write lock, so
``get``/``wait`` answer while a write waits for another process. Reads judge expiry by the clock
read after the row was read, so a record that lapsed meanwhile is never returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, Self, TypeVar
from urllib.parse import unquote

import aiosqlite

from idemstore.backends.arguments import retention_while_held
from idemstore.backends.backoff import SQLITE_BUSY, retrying
from idemstore.backends.envelope import StoreEnvelope, lost_reserve
from idemstore.backends.migrate import (
    AppliedMigration,
    Migration,
    load_migrations,
    pending_migrations,
)
from idemstore.backends.sqlite.caller_connections import main_file, usable_connection
from idemstore.backends.sqlite.client_errors import driver_errors, read_timed_out
from idemstore.backends.sqlite.listing import listed
from idemstore.backends.sqlite.migrating import absent_file, applied_versions, migration_script
from idemstore.backends.sqlite.options import OPTIONS
from idemstore.backends.sqlite.statements import (
    CHECKPOINT,
    COMPLETE,
    DELETE,
    EXTEND,
    RELEASE,
    RESERVE,
    SELECT_ROW,
    SELECT_VISIBLE,
    SWEEP,
    decode_record,
    holder_params,
    live_record,
    statements_of,
)
from idemstore.backends.sqlite.stats import STATS, counted
from idemstore.backends.sqlite.transactions import in_thread, one_hop, stopped, worth_retrying
from idemstore.backends.urls import parse_store_url
from idemstore.backends.waiting import Sighting, wait_for_holder
from idemstore.checkpoints import decode_checkpoints, encode_checkpoint
from idemstore.errors import ConfigurationError, SchemaError, StoreUnavailableError
from idemstore.protocol import Lease, Outcome, Record, Reservation
from idemstore.records import MAX_KEY_LENGTH, new_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

    from idemstore.backends.stats import StoreStats
    from idemstore.records import RecordQuery

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")

ENGINE = "sqlite"
# sweep deletes at most this many rows per write transaction, so other writers (and other
# processes) get the lock between batches however large the backlog.
SWEEP_BATCH = 500
# SQLite's own busy_timeout on our connections: how long one attempt blocks in the connection's
# thread, where asyncio cannot cancel it. Kept short so a cancellation lands within one attempt.
BUSY_ATTEMPT = 0.025
# Between attempts the store sleeps in asyncio (backoff.SQLITE_BUSY) until the configured
# busy_timeout is spent.


class SQLiteStore(StoreEnvelope[aiosqlite.Connection]):
    """A store in one SQLite database file, shared safely by the processes of one host.

    Args:
        database: a file path, or ``":memory:"`` for a private in-memory database.
        synchronous: ``"full"`` (default: an acknowledged write survives power loss) or
            ``"normal"`` (faster; in WAL mode a power loss may undo the last transactions,
            never corrupt the file).
        busy_timeout: seconds to keep trying for another process's lock before
            ``StoreUnavailableError``.
        auto_migrate: bring the schema up to date on first use (default); when false, a
            missing or older schema raises ``SchemaError``.
        max_key_length: the longest key accepted.
        clock: the time source (epoch seconds) that decides leases; injectable for tests.
    """

    __slots__ = (
        "_auto_migrate",
        "_busy_timeout",
        "_clock",
        "_database",
        "_driver_errors",
        "_lock",
        "_reader",
        "_ready",
        "_real_database",
        "_synchronous",
    )

    def __init__(
        self,
        database: str,
        *,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
        auto_migrate: bool = True,
        max_key_length: int = MAX_KEY_LENGTH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        given = OPTIONS.check(locals())
        if not isinstance(database, str) or not database:
            raise ConfigurationError("database must be a file path or ':memory:'")
        super().__init__(max_key_length=given["max_key_length"])
        self._database = database
        # What PRAGMA database_list calls the file, to recognise connections to it.
        self._real_database = "" if database == ":memory:" else os.path.realpath(database)
        self._synchronous: str = given["synchronous"]
        self._busy_timeout: float = given["busy_timeout"]
        self._auto_migrate = auto_migrate
        self._clock = clock
        self._driver_errors = driver_errors(database, self._busy_timeout)
        # Reads of a file store; None for ":memory:", whose database only its one connection
        # can see (and which no other process can lock, so its reads never wait for long).
        self._reader: aiosqlite.Connection | None = None
        self._ready = False
        # The write connection serves every task of the store; a transaction must not
        # interleave with another task's statements on it, so each transaction holds this lock
        # (and so does each read of a ":memory:" store, which must not see half a transaction).
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` or ``sqlite:///:memory:``.

        Options: those of ``OPTIONS`` (``clock`` as a keyword only).
        """
        parsed = parse_store_url(url, options)
        if parsed.netloc:
            raise ConfigurationError(
                "a sqlite:// URL takes no host: use sqlite:///relative/path.db, "
                "sqlite:////absolute/path.db or sqlite:///:memory:"
            )
        # SQLAlchemy's convention: the path is what follows the third slash.
        database = unquote(parsed.path[1:]) if parsed.path.startswith("/") else ""
        if not database:
            raise ConfigurationError(
                "a sqlite:// URL needs a database: sqlite:///relative/path.db, "
                "sqlite:////absolute/path.db or sqlite:///:memory:"
            )
        return cls(database, **OPTIONS.from_url(parsed))

    @property
    def database(self) -> str:
        """The database file path (or ``":memory:"``)."""
        return self._database

    # -- connection, errors, transactions ---------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Map every sqlite3 error to the idemstore family (through ``_driver_errors``)."""
        try:
            with self._driver_errors.translated():
                yield
        except Exception as exc:
            # close() ran while this operation was under way: aiosqlite says "Connection
            # closed" (ValueError), or sqlite3 "Cannot operate on a closed database" (which the
            # translation above made StoreUnavailableError). Either way the store is closed.
            if not self._closed or isinstance(exc, RuntimeError):
                raise
            raise RuntimeError("this SQLiteStore was closed during the operation") from exc

    async def _open(self) -> aiosqlite.Connection:
        """The write connection with its pragmas set; no schema check (migrations use it)."""

        async def setup(conn: aiosqlite.Connection) -> None:
            # WAL: readers never block the writer and vice versa, and processes share the
            # file safely. An in-memory database answers "memory": fine. Turning a fresh
            # file to WAL needs its lock, which another opener may hold.
            await self._retrying(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            await conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")

        return await self._open_connection(setup)

    async def _discard(self, connection: aiosqlite.Connection) -> None:
        await connection.close()

    async def _open_connection(
        self, setup: Callable[[aiosqlite.Connection], Awaitable[None]]
    ) -> aiosqlite.Connection:
        """A new connection with ``setup`` run on it, closed again if that fails."""
        with self._errors():
            conn = aiosqlite.connect(self._database, isolation_level=None, timeout=BUSY_ATTEMPT)
            try:
                await conn
            except BaseException:
                await stopped(conn)
                raise
            try:
                await setup(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _connected(self) -> aiosqlite.Connection:
        """The connection, once the schema is known to be current (migrating it if allowed)."""
        conn = self._connection
        if self._ready and conn is not None:
            return conn
        conn = await self._connect()
        if not self._ready:
            available = load_migrations(ENGINE)
            if self._auto_migrate:
                await self.apply_migrations(available)
            else:
                pending = pending_migrations(available, await self.applied_migrations())
                if pending:
                    names = ", ".join(m.name for m in pending)
                    raise SchemaError(
                        f"the SQLite database {self._database!r} lacks migrations {names}; "
                        f"run `idemstore migrate sqlite:///{self._database}` "
                        "(or drop auto_migrate=false)"
                    )
            self._ready = True
        return conn

    def _retrying(self, attempt: Callable[[], Awaitable[_T]]) -> Awaitable[_T]:
        """``attempt()``, tried again while the database is busy, for up to ``busy_timeout``.

        Each attempt blocks at most ``BUSY_ATTEMPT`` in SQLite; the waits between attempts are
        asyncio sleeps, where a cancellation lands at once.
        """
        return retrying(
            attempt, retry_on=worth_retrying, backoff=SQLITE_BUSY, within=self._busy_timeout
        )

    @contextlib.asynccontextmanager
    async def _write(self, conn: aiosqlite.Connection) -> AsyncIterator[float]:
        """A ``BEGIN IMMEDIATE`` transaction; yields the clock read once the lock is held.

        Commits when the block ends, rolls back on any exception including cancellation.
        """
        async with self._lock:
            try:
                # Inside the try: if we are cancelled while a BEGIN attempt runs in the
                # connection's thread, it may still take the lock; the ROLLBACK below is queued
                # behind it (at most BUSY_ATTEMPT), so the connection never stays in a
                # transaction nobody will finish, and the next BEGIN is queued behind both.
                await self._retrying(lambda: conn.execute("BEGIN IMMEDIATE"))
                yield self._clock()
                # A COMMIT that finds the database busy (a rollback-journal file with readers)
                # leaves the transaction open and may be retried.
                await self._retrying(lambda: conn.execute("COMMIT"))
            except BaseException:
                with contextlib.suppress(sqlite3.Error, ValueError):
                    await conn.execute("ROLLBACK")
                raise

    async def _transact(
        self, conn: aiosqlite.Connection, body: Callable[[sqlite3.Connection, float], _T]
    ) -> _T:
        """``body(connection, now)`` in one ``BEGIN IMMEDIATE`` transaction, in one hop to the
        connection's thread (see ``transactions.one_hop``), retried while the file is busy."""
        abandoned = threading.Event()
        transaction = one_hop(conn, self._clock, body, abandoned)
        async with self._lock:
            try:
                return await self._retrying(lambda: in_thread(conn, transaction))
            except BaseException:
                # Cancelled (or failed) while the call may still be queued: roll it back.
                abandoned.set()
                raise

    async def _read_connection(self) -> aiosqlite.Connection | None:
        """The read-only connection of a file store (opened on first use); None for memory."""
        if self._reader is not None or self._database == ":memory:":
            return self._reader
        async with self._connect_lock:
            self._check_open()
            if self._reader is None:

                async def setup(conn: aiosqlite.Connection) -> None:
                    # Opened after the write connection made the file WAL and migrated it.
                    await conn.execute("PRAGMA query_only = ON")

                opening = self._open_connection(setup)
                self._reader = await self._opened(opening, self._discard)
            return self._reader

    async def _read(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        """Rows of one autocommit statement; never queued behind a write of a file store."""
        conn = await self._connected()
        reader = await self._read_connection()
        with self._errors():
            if reader is not None:
                return list(await self._retrying(lambda: reader.execute_fetchall(sql, parameters)))
            async with self._lock:
                return list(await conn.execute_fetchall(sql, parameters))

    # -- migrations (SupportsMigrations) ----------------------------------------------------

    async def absent_database(self) -> str | None:
        """Why there is no database to read, or None: the file does not exist (opening it
        would create it, which ``idemstore migrate --status`` must not)."""
        if self._connection is not None or self._database == ":memory:":
            return None
        if await asyncio.to_thread(os.path.exists, self._database):
            return None
        return absent_file(self._database)

    async def applied_migrations(self) -> list[AppliedMigration]:
        """The versions table, in order; empty when it (or the database file) does not exist
        yet: a missing file is not created."""
        if await self.absent_database() is not None:
            return []
        conn = await self._connect()
        with self._errors():
            async with self._lock:
                return await self._retrying(lambda: applied_versions(conn))

    async def apply_migrations(self, available: Sequence[Migration]) -> list[Migration]:
        """Apply each pending migration in its own ``BEGIN IMMEDIATE`` transaction.

        The write lock is held from re-reading the versions table to the commit, so processes
        that open a fresh file at once apply each migration exactly once between them.
        """
        conn = await self._connect()
        done: list[Migration] = []
        with self._errors():
            while True:
                async with self._write(conn):
                    pending = pending_migrations(available, await applied_versions(conn))
                    if not pending:
                        break
                    for statement in statements_of(pending[0]):
                        await conn.execute(statement)
                done.append(pending[0])
        return done

    def migration_sql(self, migration: Migration) -> str:
        """The statements ``apply_migrations`` runs for ``migration``, as one script."""
        return migration_script(migration)

    # -- the contract -------------------------------------------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        conn = await self._connected()
        token = new_token()
        held = retention_while_held(lease_ttl, retention)

        def body(raw: sqlite3.Connection, now: float) -> tuple[list[Any], list[Any] | None]:
            params = {
                "scope": scope,
                "key": key,
                "fingerprint": fingerprint,
                "token": token,
                "now": now,
                "lease_ttl": lease_ttl,
                "held": held,
            }
            won = raw.execute(RESERVE, params).fetchall()
            # Read in the same transaction, under the same lock: what blocked us.
            return won, None if won else raw.execute(SELECT_ROW, (scope, key)).fetchall()

        with self._errors():
            won, row = await self._transact(conn, body)
        if won:
            fence, takeover, deadline, kept = won[0]
            lease = Lease(scope, key, token, fence, deadline, retention)
            return Reservation(
                Outcome.ACQUIRED,
                lease=lease,
                takeover=bool(takeover),
                checkpoints=decode_checkpoints(kept),
            )
        assert row, "reserve left a row alone, so the row exists"
        return lost_reserve(decode_record(row[0]), fingerprint)

    async def _complete(self, lease: Lease, response: bytes, retention: float) -> bool:
        conn = await self._connected()

        def body(raw: sqlite3.Connection, now: float) -> bool:
            params = holder_params(lease, now)
            params.update(response=response, retention=retention)
            return bool(raw.execute(COMPLETE, params).fetchall())

        with self._errors():
            return await self._transact(conn, body)

    # -- settling in the caller's transaction (idemstore.execution.settling) -----------------

    async def check_connection(self, connection: object) -> None:
        """``ConfigurationError`` unless ``connection`` is an aiosqlite connection to this
        store's database file, with a transaction open."""
        self._check_open()
        caller = usable_connection(connection, self._database)
        await self._connected()  # the schema is there before anyone completes through it
        with self._errors():
            main = await main_file(caller)
        if main != self._real_database:
            raise ConfigurationError(
                f"connection=... was given a connection to {main or 'a private database'}"
                f", not this store's database {self._database!r}: the outcome must commit in the"
                " same database as your writes. Nothing was recorded"
            )

    async def complete_within(
        self, connection: object, lease: Lease, response: bytes, retention: float
    ) -> bool:
        """``complete``'s fenced statement, on ``connection`` (see ``check_connection``). The
        caller's connection waits for the write lock as the caller configured it."""
        assert isinstance(connection, aiosqlite.Connection), "check_connection came first"
        params = holder_params(lease, self._clock())
        params.update(response=response, retention=retention)
        with self._errors():
            return bool(await connection.execute_fetchall(COMPLETE, params))

    async def checkpoint_within(
        self, connection: object, lease: Lease, name: str, data: bytes
    ) -> bool:
        """``_checkpoint``'s fenced statement, on ``connection`` (see ``check_connection``)."""
        assert isinstance(connection, aiosqlite.Connection), "check_connection came first"
        params = holder_params(lease, self._clock())
        params["entry"] = encode_checkpoint(name, data)
        with self._errors():
            return bool(await connection.execute_fetchall(CHECKPOINT, params))

    async def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        conn = await self._connected()
        entry = encode_checkpoint(name, data)

        def body(raw: sqlite3.Connection, now: float) -> bool:
            params = holder_params(lease, now) | {"entry": entry}
            return bool(raw.execute(CHECKPOINT, params).fetchall())

        with self._errors():
            return await self._transact(conn, body)

    async def _release(self, lease: Lease) -> bool:
        conn = await self._connected()

        def body(raw: sqlite3.Connection, now: float) -> bool:
            return bool(raw.execute(RELEASE, holder_params(lease, now)).fetchall())

        with self._errors():
            return await self._transact(conn, body)

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        conn = await self._connected()

        def body(raw: sqlite3.Connection, now: float) -> list[Any]:
            params = holder_params(lease, now)
            params["lease_ttl"] = lease_ttl
            params["held"] = retention_while_held(lease_ttl, lease.retention)
            return raw.execute(EXTEND, params).fetchall()

        with self._errors():
            rows = await self._transact(conn, body)
        if not rows:
            return None
        return Lease(lease.scope, lease.key, lease.token, lease.fence, rows[0][0], lease.retention)

    async def _get(self, key: str, scope: str) -> Record | None:
        rows = await self._read(SELECT_VISIBLE, (scope, key))
        return live_record(rows, self._clock())

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        async def read() -> Sighting:
            rows = await self._read(SELECT_VISIBLE, (scope, key))
            now = self._clock()
            return Sighting(live_record(rows, now), now)

        # No push channel between processes sharing a file: the loop polls.
        return await wait_for_holder(read, timeout=timeout, unavailable=self._timed_out)

    def _timed_out(self, exc: TimeoutError) -> StoreUnavailableError:
        return read_timed_out(self._database)

    async def _delete(self, key: str, scope: str) -> bool:
        conn = await self._connected()

        def body(raw: sqlite3.Connection, now: float) -> tuple[float, list[Any]]:
            return now, raw.execute(DELETE, (scope, key)).fetchall()

        with self._errors():
            now, rows = await self._transact(conn, body)
        # True only if a live record went: a tombstone or an expired row was already absent.
        return any(status != "released" and expires_at > now for status, expires_at in rows)

    async def _sweep(self, limit: int) -> int:
        conn = await self._connected()
        removed = 0
        with self._errors():
            while removed < limit:
                batch = min(SWEEP_BATCH, limit - removed)
                async with self._write(conn) as now:
                    count = len(list(await conn.execute_fetchall(SWEEP, (now, batch))))
                removed += count
                if count < batch:
                    break
        return removed

    async def _ping(self) -> None:
        await self._read("SELECT 1", ())

    async def _stats(self, limit: int) -> StoreStats:
        """One COUNT query over the table (``sqlite.stats.STATS``); ``limit`` does not
        apply."""
        now = self._clock()
        rows = await self._read(STATS, {"now": now})
        return counted(rows[0], now)

    def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        return listed(query, self._read, self._clock())

    async def _enter(self) -> None:
        await self._connected()

    async def _disconnect(self, connection: aiosqlite.Connection | None) -> None:
        reader, self._reader = self._reader, None
        with self._errors():
            try:
                if connection is not None:
                    await connection.close()
            finally:
                # Even if the first close failed: a connection left open keeps its thread, and
                # with it the process, alive.
                if reader is not None:
                    await reader.close()
