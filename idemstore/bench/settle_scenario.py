"""The ``settle`` bench scenario: what settling inside the caller's transaction costs.

For each SQL target (PostgreSQL, a SQLite file), one worker charges keys into a business
table two ways, in interleaved rounds so that drift hits both alike: the plain two-step path
(the floor: the business transaction commits, then ``settle(response)`` completes the key
through the store's own connection) and the subject, ``settle(response, connection=conn)``
inside the business transaction (one commit for both). Each call is a whole keyed charge:
``begin`` (the reserve), the business transaction and the settlement. ``ratio_p50`` under 1
means the transactional path is cheaper. The business table (``idemstore_bench_charges``,
beside the store's records) is created for the run and dropped after it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from idemstore.backends.urls import open_store, redact_url
from idemstore.bench.results import Measurement, NotApplicable, Timing, on_each_target
from idemstore.execution import ExecutionPolicy, Replay

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.bench.results import Unavailable
    from idemstore.bench.runner import Target
    from idemstore.bench.scenarios import Load
    from idemstore.protocol import IdempotencyStore

__all__ = ["run_settle"]

ROUNDS = 5
FLOOR = "business commit, then settle"
SCOPE = "idemstore-bench"
RETENTION = 3600.0
FINGERPRINT = "settle-bench"
RESPONSE = b"x" * 256
TABLE = "idemstore_bench_charges"


class _Caller:
    """The caller's connection to the store's database: begin, one charge row, commit."""

    def __init__(self, connection: Any, postgres: bool, table: str) -> None:
        self.connection = connection
        self.postgres = postgres
        self.table = table
        self.insert = f"INSERT INTO {table} (key) VALUES ({'$1' if postgres else '?'})"

    async def begin(self) -> None:
        await self.connection.execute("BEGIN")

    async def charge(self, key: str) -> None:
        if self.postgres:
            await self.connection.execute(self.insert, key)
        else:
            await self.connection.execute(self.insert, (key,))

    async def commit(self) -> None:
        await self.connection.execute("COMMIT")

    async def rollback(self) -> None:
        await self.connection.execute("ROLLBACK")


async def _caller(store: IdempotencyStore) -> _Caller:
    """A connection of the caller's own to ``store``'s database, with the business table."""
    name = type(store).__name__
    known: Any = store  # the two SQL stores, told apart by name so no driver is imported
    if name == "PostgresStore":
        import asyncpg

        # The DSN and schema the store itself uses: the same database, by construction.
        connection = await asyncpg.connect(known.dsn)
        caller = _Caller(connection, True, f'"{known.schema}".{TABLE}')
    elif name == "SQLiteStore" and known.database != ":memory:":
        import aiosqlite

        connection = await aiosqlite.connect(known.database, isolation_level=None)
        await connection.execute("PRAGMA journal_mode = WAL")
        caller = _Caller(connection, False, TABLE)
    else:
        raise NotApplicable(
            "settling in a transaction needs a SQL store in a database the caller's connection"
            " reaches (postgresql://, or a sqlite:/// file)"
        )
    await connection.execute(f"CREATE TABLE IF NOT EXISTS {caller.table} (key text NOT NULL)")
    return caller


async def _round(
    policy: ExecutionPolicy, caller: _Caller, keys: list[str], timing: Timing, *, within: bool
) -> None:
    clock = time.perf_counter_ns
    started = time.perf_counter()
    for key in keys:
        begun = clock()
        claim = await policy.begin(key, FINGERPRINT, scope=SCOPE)
        assert not isinstance(claim, Replay), "every key of the bench is fresh"
        async with claim:
            await caller.begin()
            try:
                await caller.charge(key)
                if within:
                    await claim.settle(RESPONSE, connection=caller.connection)
                await caller.commit()
            except BaseException:
                await caller.rollback()
                raise
            if not within:
                await claim.settle(RESPONSE)
        timing.latencies_ns.append(clock() - begun)
        timing.executions += 1
    timing.seconds += time.perf_counter() - started
    timing.unique_keys += len(keys)


async def _one_target(target: Target, load: Load, prefix: str) -> Measurement:
    per_round = max(2, (load.ops or 1000) // (2 * ROUNDS))
    floor, subject = Timing(), Timing()
    async with open_store(target.url) as store:
        policy = ExecutionPolicy(store, retention=RETENTION, consumer="bench")
        caller = await _caller(store)
        try:
            for n in range(ROUNDS):
                keys = [f"{prefix}{n}-{j}" for j in range(per_round)]
                await _round(policy, caller, [k + ":2" for k in keys], floor, within=False)
                await _round(policy, caller, [k + ":t" for k in keys], subject, within=True)
        finally:
            await caller.connection.execute(f"DROP TABLE IF EXISTS {caller.table}")
            await caller.connection.close()
    measurement = Measurement.of_one_caller(
        target.name, "settle", subject, floor, FLOOR, url=redact_url(target.url)
    )
    ratio = measurement.ratio_p50
    if ratio is not None:
        measurement.notes["ratio_p50"] = round(ratio, 3)
    return measurement


async def run_settle(
    targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """The scenario on every target; a target that is no SQL store, or fails, is
    ``Unavailable``."""
    return await on_each_target(targets, "settle", lambda target: _one_target(target, load, prefix))
