"""``postgresql://`` (also ``postgres://``): records in a PostgreSQL table, through asyncpg.

Every operation is one round trip but a takeover and some retries (``reserving``): ``release``
and ``delete`` call functions installed by ``migrations/postgres``; ``reserve`` is a plain
``INSERT``, a read when the key exists, and ``idemstore_reserve`` when it may be taken over;
the rest are single statements. The database clock decides leases and retention. Acquisitions
of a key are serialised by a *transaction-level* advisory lock on a 64-bit hash of (schema,
scope, key), so nothing outlives a transaction and the store works behind PgBouncer in
transaction pooling mode. ``wait`` listens for the ``NOTIFY`` sent by ``complete``/``release``/
``delete`` on one dedicated connection per store, and polls when that connection is down.
"""

from __future__ import annotations

import asyncio
import hashlib
from functools import partial
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlencode, urlunsplit

import asyncpg

from idemstore.backends.arguments import retention_while_held
from idemstore.backends.envelope import StoreEnvelope
from idemstore.backends.migrate import AppliedMigration, Migration, load_migrations
from idemstore.backends.postgres.caller_connections import (
    IDENTITY,
    Identity,
    another_database,
    caller_session,
    session_identity,
    session_of,
)
from idemstore.backends.postgres.client_errors import (
    OTHER_SCHEMAS,
    connect_timed_out,
    driver_errors,
    migrate_command,
    unmigrated,
)
from idemstore.backends.postgres.clocks import PostgresClocks
from idemstore.backends.postgres.host_lists import split_host_list
from idemstore.backends.postgres.listening import Listener, Subscription
from idemstore.backends.postgres.listing import RECORDS
from idemstore.backends.postgres.migrating import applied_migrations, apply_pending, migration_sql
from idemstore.backends.postgres.options import OPTIONS
from idemstore.backends.postgres.reserving import KnownKeys, record_from_row
from idemstore.backends.postgres.statements import (
    APPLIED_MIGRATIONS,
    CHECKPOINT,
    COMPLETE,
    CONNECTION_PARAMETERS,
    CREATE_VERSIONS_TABLE,
    DELETE,
    EXTEND,
    GET,
    HEAP_PAGES,
    RELEASE,
    RESERVE,
    RESERVE_KNOWN,
    RESERVE_READ,
    RESERVE_TAKEOVER,
    SWEEP_BATCH,
    WATCH,
    hash64,
    lock_keys,
    quote_ident,
    record_id,
    seconds,
)
from idemstore.backends.postgres.stats import STATS, counted
from idemstore.backends.postgres.sweeping import HeapSweep
from idemstore.backends.urls import parse_store_url, redact_url
from idemstore.backends.waiting import Sighting, wait_for_holder
from idemstore.checkpoints import decode_checkpoints, encode_checkpoint
from idemstore.errors import ConfigurationError
from idemstore.protocol import Lease, Outcome, Record, Reservation
from idemstore.records import MAX_KEY_LENGTH, new_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from idemstore.backends.stats import StoreStats
    from idemstore.records import RecordQuery

__all__ = ["PostgresStore"]

# The store's statements by name, each with ``{s}`` where its quoted schema goes.
_TEMPLATES = {
    "reserve": RESERVE,
    "reserve_known": RESERVE_KNOWN,
    "reserve_read": RESERVE_READ,
    "reserve_takeover": RESERVE_TAKEOVER,
    "complete": COMPLETE,
    "checkpoint": CHECKPOINT,
    "release": RELEASE,
    "delete": DELETE,
    "extend": EXTEND,
    "get": GET,
    "watch": WATCH,
    "sweep": SWEEP_BATCH,
    "heap_pages": HEAP_PAGES,
    "applied": APPLIED_MIGRATIONS,
    "versions": CREATE_VERSIONS_TABLE,
    "stats": STATS,
    "records": RECORDS,
    "identity": IDENTITY,
}


async def _no_reset(connection: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query when a connection returns to the pool.

    The store leaves no session state behind (no session locks, no LISTEN on pooled
    connections, no SET), and the default reset would cost a second round trip per operation.
    """


class PostgresStore(StoreEnvelope[asyncpg.Pool]):
    """A store in a PostgreSQL table. Build it with ``open_store("postgresql://...")``.

    The schema must be migrated first (``idemstore migrate URL``) unless ``auto_migrate`` is
    set. See docs/backends/postgres.md for every option.
    """

    __slots__ = (
        "_auto_migrate",
        "_channel",
        "_command_timeout",
        "_connect_timeout",
        "_dsn",
        "_errors",
        "_identity",
        "_known",
        "_listener",
        "_lock_key",
        "_max_inactive_lifetime",
        "_migrate_hint",
        "_migration_lock",
        "_pool_max_size",
        "_pool_min_size",
        "_ready",
        "_redacted",
        "_schema",
        "_sql",
        "_statement_cache_size",
        "_sweeping",
        "clocks",
    )

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        command_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        statement_cache_size: int = 100,
        max_inactive_connection_lifetime: float = 300.0,
        auto_migrate: bool = False,
        listen: bool = True,
        listen_dsn: str | None = None,
        sweep_batch_size: int = 500,
        max_key_length: int = MAX_KEY_LENGTH,
        url: str | None = None,
        max_clock_skew: float = 1.0,
        clock_skew_policy: str = "warn",
        clock_check_interval: float = 60.0,
    ) -> None:
        """``dsn`` is what asyncpg connects to; ``url``, when given, is the store URL the user
        wrote, shown (password hidden) in errors so that ``idemstore migrate URL`` names the
        same schema."""
        given = OPTIONS.check(locals())
        if pool_min_size > pool_max_size:
            raise ConfigurationError(
                f"pool_min_size ({pool_min_size}) must not exceed pool_max_size ({pool_max_size})"
            )
        super().__init__(max_key_length=max_key_length)
        self._dsn = dsn
        self._redacted = redact_url(url or dsn)
        self._migrate_hint = migrate_command(url or dsn, schema)
        self._errors = driver_errors(self._redacted, self._migrate_hint)
        self._schema = schema
        quoted = quote_ident(schema)
        self._sql = {name: template.format(s=quoted) for name, template in _TEMPLATES.items()}
        self._pool_min_size = pool_min_size
        self._pool_max_size = pool_max_size
        self._command_timeout: float = given["command_timeout"]
        self._connect_timeout: float = given["connect_timeout"]
        self._statement_cache_size = statement_cache_size
        self._max_inactive_lifetime = max_inactive_connection_lifetime
        self._auto_migrate = auto_migrate
        self._sweeping = HeapSweep(sweep_batch_size)
        # One NOTIFY channel per schema; the payload names the key by its lock hash.
        self._channel = "idemstore_" + hashlib.blake2b(schema.encode(), digest_size=8).hexdigest()
        self._migration_lock = hash64("idemstore migrate", schema)
        # hash64(schema, scope, key): the advisory lock key and the NOTIFY payload of a key.
        self._lock_key = lock_keys(schema)
        self._ready = False
        self._identity: Identity | None = None
        self._listener = Listener(
            listen_dsn or dsn,
            self._channel,
            enabled=listen,
            connect_timeout=self._connect_timeout,
            command_timeout=self._command_timeout,
            errors=self._errors.catches,
        )
        self._known = KnownKeys()
        # The clocks leases are measured by (see clocks): their skew is the metric.
        self.clocks = PostgresClocks(self._redacted, dsn, given)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        first_host_url, host_list = split_host_list(url)
        parsed = parse_store_url(first_host_url, options)
        # asyncpg's connection parameters pass through to the DSN, as text.
        connection = {
            name: str(parsed.options.pop(name))
            for name in sorted(CONNECTION_PARAMETERS & set(parsed.options))
        }
        kwargs = OPTIONS.from_url(parsed, also_known=CONNECTION_PARAMETERS)
        connection.setdefault("application_name", "idemstore")
        # asyncpg reads the connection parameters from the DSN; our options never reach it.
        netloc = host_list or parsed.netloc
        dsn = urlunsplit(("postgresql", netloc, parsed.path, urlencode(connection), ""))
        return cls(dsn, url=url, **kwargs)

    @property
    def dsn(self) -> str:
        """The connection string asyncpg connects with (it may hold a password: never log
        it); a caller's own connection to the store's database can use it."""
        return self._dsn

    @property
    def schema(self) -> str:
        """The schema that holds the store's tables."""
        return self._schema

    # -- connections ----------------------------------------------------------------------

    async def _open(self) -> asyncpg.Pool:
        """The pool (the schema is checked by ``_ensure_ready``)."""
        try:
            pool: asyncpg.Pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._pool_min_size,
                max_size=self._pool_max_size,
                command_timeout=self._command_timeout,
                timeout=self._connect_timeout,
                statement_cache_size=self._statement_cache_size,
                max_inactive_connection_lifetime=self._max_inactive_lifetime,
                reset=_no_reset,
            )
            # The server's clock, read on the pool's first connection (see clocks).
            await self.clocks.opened(pool)
        except TimeoutError as exc:
            # Only the connects (and that first read) run under a bound while the pool opens.
            raise connect_timed_out(self._redacted, self._connect_timeout) from exc
        except self._errors.catches as exc:
            raise self._errors.translate(exc) from exc
        return pool

    async def _discard(self, connection: asyncpg.Pool) -> None:
        try:
            await asyncio.wait_for(connection.close(), self._command_timeout)
        except self._errors.catches:
            connection.terminate()

    async def _ensure_ready(self) -> asyncpg.Pool:
        """The pool, once the schema is known to be migrated (or migrated now if allowed)."""
        pool = await self._connect()
        if self._ready:
            return pool
        async with self._connect_lock:
            if not self._ready:
                await self._check_schema()
                self._ready = True
        return pool

    async def _check_schema(self) -> None:
        available = load_migrations("postgres")
        applied = {m.name for m in await self.applied_migrations()}
        # Only what this code needs must be there: a newer schema (migrated by a newer
        # idemstore during a rolling deploy) is fine, and `idemstore migrate` checks checksums.
        missing = [m.name for m in available if m.name not in applied]
        if not missing:
            return
        if self._auto_migrate:
            await self.apply_migrations(available)
            return
        with self._errors.translated():
            rows = await (await self._connect()).fetch(OTHER_SCHEMAS, self._schema)
        others = [row[0] for row in rows]
        raise unmigrated(self._schema, self._redacted, missing, others, self._migrate_hint)

    async def _fetchrow(self, name: str, *args: Any) -> Any:
        pool = self._connection if self._ready else None
        if pool is None:  # not yet connected and checked (or closed): the slow path
            pool = await self._ensure_ready()
        self.clocks.check_calls()
        return await self._errors.awaited(pool.fetchrow(self._sql[name], *args))

    async def _fetchval(self, name: str, *args: Any) -> Any:
        pool = self._connection if self._ready else None
        if pool is None:  # not yet connected and checked (or closed): the slow path
            pool = await self._ensure_ready()
        self.clocks.check_calls()
        return await self._errors.awaited(pool.fetchval(self._sql[name], *args))

    # -- migrations (SupportsMigrations) ------------------------------------------------------

    def migration_sql(self, migration: Migration) -> str:
        """The migration's SQL with this store's quoted schema in place of ``{{schema}}``."""
        return migration_sql(migration, self._schema)

    async def applied_migrations(self) -> list[AppliedMigration]:
        pool = await self._connect()
        with self._errors.translated():
            return await applied_migrations(pool, self._schema, self._sql["applied"])

    async def apply_migrations(self, available: Sequence[Migration]) -> list[Migration]:
        """Apply what is pending (see ``migrating.apply_pending``)."""
        pool = await self._connect()
        with self._errors.translated():
            return await apply_pending(
                pool,
                available,
                schema=self._schema,
                lock=self._migration_lock,
                sql=self._sql,
                where=self._redacted,
            )

    # -- the contract -----------------------------------------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        token = new_token()
        # The row's retention while held is never shorter than the lease.
        held = seconds(retention_while_held(lease_ttl, retention))
        args = (scope, key, fingerprint, token, seconds(lease_ttl), held)
        row_id = record_id(scope, key)
        known = self._known
        if row_id in known:  # seen to exist (a retry?): insert or read in one statement
            row = await self._fetchrow("reserve_known", *args, row_id)
            fresh = row is not None and row["outcome"] == "acquired"
        else:  # the common case, a new key: a plain INSERT, and a read if the key exists
            known.add(row_id)
            row = await self._fetchrow("reserve", *args, row_id)
            fresh = row is not None
            if not fresh:
                row = await self._fetchrow("reserve_read", row_id, fingerprint)
        if fresh:
            lease = Lease(scope, key, token, row["fence"], row["lease_expires_at"], retention)
            return Reservation(Outcome.ACQUIRED, lease=lease)
        if row is None:  # the key may be taken over, or is gone again
            row = await self._fetchrow("reserve_takeover", self._lock_key(scope, key), *args)
        outcome = Outcome(row["outcome"])
        if outcome is Outcome.ACQUIRED:
            lease = Lease(scope, key, token, row["fence"], row["lease_expires_at"], retention)
            return Reservation(
                outcome,
                lease=lease,
                takeover=row["takeover"],
                checkpoints=decode_checkpoints(row["checkpoints"]),
            )
        return Reservation(outcome, record=record_from_row(scope, key, row))

    async def _complete(self, lease: Lease, response: bytes, retention: float) -> bool:
        # No row: not the holder.
        done = await self._fetchval("complete", *self._complete_args(lease, response, retention))
        return done is not None

    def _complete_args(self, lease: Lease, response: bytes, retention: float) -> tuple[Any, ...]:
        """The arguments of the ``complete`` statement, on the store's pool or the caller's
        connection alike."""
        return (
            record_id(lease.scope, lease.key),
            lease.token,
            lease.fence,
            response,
            seconds(retention),
            self._channel,
            self._lock_key(lease.scope, lease.key),
        )

    async def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        done: bool = await self._fetchval(
            "checkpoint",
            lease.scope,
            lease.key,
            lease.token,
            lease.fence,
            encode_checkpoint(name, data),
        )
        return done

    async def _release(self, lease: Lease) -> bool:
        done: bool = await self._fetchval(
            "release",
            lease.scope,
            lease.key,
            lease.token,
            lease.fence,
            self._channel,
            self._lock_key(lease.scope, lease.key),
        )
        return done

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        deadline = await self._fetchval(
            "extend",
            lease.scope,
            lease.key,
            lease.token,
            lease.fence,
            seconds(lease_ttl),
            seconds(retention_while_held(lease_ttl, lease.retention)),
        )
        if deadline is None:
            return None
        return Lease(lease.scope, lease.key, lease.token, lease.fence, deadline, lease.retention)

    # -- settling in the caller's transaction (idemstore.execution.settling) -----------------

    async def _store_identity(self, *, fresh: bool = False) -> Identity:
        if self._identity is None or fresh:
            row = await self._fetchrow("identity", self._records_table())
            self._identity = (row[0], row[1], row[2])
        return self._identity

    def _records_table(self) -> str:
        return f"{quote_ident(self._schema)}.idemstore_records"

    async def check_connection(self, connection: object) -> None:
        """``ConfigurationError`` unless ``connection`` is an asyncpg connection (or one
        acquired from a pool) to this store's database, with a transaction open."""
        self._check_open()
        session = caller_session(connection)
        with self._errors.translated():
            theirs = await session_identity(session, self._records_table())
            # A server restarted since we asked has a new start time: ask again before refusing.
            if theirs != await self._store_identity() and theirs != await self._store_identity(
                fresh=True
            ):
                raise another_database(theirs, self._schema, self._redacted)

    async def complete_within(
        self, connection: object, lease: Lease, response: bytes, retention: float
    ) -> bool:
        """``complete``'s fenced statement, on ``connection`` (see ``check_connection``)."""
        session = session_of(connection)
        assert session is not None, "check_connection came first"
        with self._errors.translated():
            done = await session.fetchval(
                self._sql["complete"], *self._complete_args(lease, response, retention)
            )
        return done is not None

    async def checkpoint_within(
        self, connection: object, lease: Lease, name: str, data: bytes
    ) -> bool:
        """``_checkpoint``'s fenced function call, on ``connection`` (see ``check_connection``)."""
        session = session_of(connection)
        assert session is not None, "check_connection came first"
        args = (lease.scope, lease.key, lease.token, lease.fence, encode_checkpoint(name, data))
        with self._errors.translated():
            done: bool = await session.fetchval(self._sql["checkpoint"], *args)
        return done

    async def _get(self, key: str, scope: str) -> Record | None:
        row = await self._fetchrow("get", scope, key)
        return None if row is None else record_from_row(scope, key, row)

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        """Woken by NOTIFY through the store's listener connection; polls while it is down.
        Every read, and opening the listener, is bounded by what is left of ``timeout``."""
        lock_key = self._lock_key(scope, key)

        async def read() -> Sighting:
            # Marks a record in progress watched: only then do complete and release notify.
            row = await self._fetchrow("watch", scope, key)
            if row is None:
                return Sighting(None, 0.0)
            return Sighting(record_from_row(scope, key, row), row["now"])

        async def subscribe() -> Subscription:
            # Registered before the listener may connect: a NOTIFY meanwhile is not lost.
            subscription = self._listener.subscribe(lock_key)
            try:
                await self._listener.ensure(lambda: self._closed)
            except BaseException:
                # Cut off by the wait's deadline while connecting: the loop never sees it.
                subscription.close()
                raise
            return subscription

        return await wait_for_holder(
            read, timeout=timeout, unavailable=self._errors.translate, subscribe=subscribe
        )

    async def _delete(self, key: str, scope: str) -> bool:
        existed: bool = await self._fetchval(
            "delete", scope, key, self._channel, self._lock_key(scope, key)
        )
        return existed

    async def _sweep(self, limit: int) -> int:
        return await self._sweeping.sweep(limit, self._heap_pages, partial(self._fetchrow, "sweep"))

    async def _heap_pages(self) -> int:
        return int(await self._fetchval("heap_pages") or 0)

    async def _ping(self) -> None:
        pool = await self._ensure_ready()
        with self._errors.translated():
            await pool.fetchval("SELECT 1")

    async def _stats(self, limit: int) -> StoreStats:
        """One COUNT ... FILTER query (``postgres.stats.STATS``); ``limit`` does not apply."""
        return counted(await self._fetchrow("stats"))

    async def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        """One statement (``postgres.listing.RECORDS``), the filters by the database clock."""
        pool = await self._ensure_ready()
        state = None if query.state is None else query.state.value
        fetching = pool.fetch(
            self._sql["records"], query.scope, state, query.older_than, query.limit
        )
        for row in await self._errors.awaited(fetching):
            yield record_from_row(row["scope"], row["key"], row)

    # -- lifecycle --------------------------------------------------------------------------

    async def _disconnect(self, connection: asyncpg.Pool | None) -> None:
        await self.clocks.stop()
        self._listener.close()
        if connection is not None:
            await self._discard(connection)

    async def _enter(self) -> None:
        # Connect, but leave the schema check to the first operation: `async with` must also
        # work for the migration runner on a database that has no schema yet.
        await self._connect()
