"""Measure PostgresStore.reserve against the raw-driver floor on the same server, same run.

    PYTHONPATH=. python benchmarks/postgres_reserve.py [--dsn postgresql://...] [--ops 1000]

Without ``--dsn`` it starts a throwaway PostgreSQL 15 (fsync on) with
``idemstore.local_servers.postgres`` and measures with synchronous_commit on, then off. For each
concurrency (1 and 64 by default) it runs rounds of: the floor (a bare asyncpg ``INSERT ... ON
CONFLICT DO NOTHING`` of the same row shape into a copy of the records table), then ``reserve``
of fresh keys, with the same pool size, and reports p50/p99 latency and throughput. Then it
counts what a replay writes (pg_stat_user_tables and WAL bytes) and how fast ``wait`` wakes
after ``complete``. Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

import asyncpg

from idemstore.backends.postgres import PostgresStore
from idemstore.migrate import load_migrations
from idemstore.records import new_token

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

FLOOR_INSERT = """
INSERT INTO {s}.floor (scope, key, fingerprint, status, released, token, fence,
                       created_at, expires_at, lease_expires_at)
VALUES ($1, $2, $3, 'in_progress', false, $4, 1, clock_timestamp(),
        clock_timestamp() + make_interval(secs => $5),
        clock_timestamp() + make_interval(secs => $6))
ON CONFLICT (scope, key) DO NOTHING"""


async def _no_reset(connection: asyncpg.Connection) -> None:
    pass


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


async def drive(
    op: Callable[[int], Awaitable[Any]], ops: int, concurrency: int
) -> tuple[list[float], float]:
    """Run ``op(i)`` for i in range(ops) on ``concurrency`` workers; latencies and wall time."""
    latencies: list[float] = []
    counter = iter(range(ops))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": percentile(ordered, 0.50) * 1000,
        "p99_ms": percentile(ordered, 0.99) * 1000,
        "ops_s": len(latencies) / wall,
    }


async def bench_concurrency(dsn: str, schema: str, concurrency: int, ops: int, rounds: int) -> str:
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    store = PostgresStore.from_url(
        url, pool_min_size=concurrency, pool_max_size=concurrency, listen=False
    )
    # The floor pool skips asyncpg's reset query on release, as the store does: otherwise the
    # floor would pay a second round trip per insert.
    pool = await asyncpg.create_pool(
        dsn, min_size=concurrency, max_size=concurrency, reset=_no_reset
    )
    floor_sql = FLOOR_INSERT.format(s=f'"{schema}"')
    rows = []
    try:
        await store.ping()
        run = uuid.uuid4().hex[:8]

        async def warm(i: int) -> None:
            await pool.execute(floor_sql, "", f"w{run}-{i}", "fp", new_token(), 60.0, 30.0)
            await store.reserve(f"w{run}-{i}", "fp", lease_ttl=30, retention=60)

        await drive(warm, 200, concurrency)
        for r in range(rounds):
            prefix = f"{run}-{r}"

            async def floor(i: int, prefix: str = prefix) -> None:
                await pool.execute(floor_sql, "", f"{prefix}-{i}", "fp", new_token(), 60.0, 30.0)

            async def reserve(i: int, prefix: str = prefix) -> None:
                await store.reserve(f"{prefix}-{i}", "fp", lease_ttl=30, retention=60)

            # Alternate which goes first, so a drift in machine load does not favour one.
            if r % 2 == 0:
                f = summary(*await drive(floor, ops, concurrency))
                s = summary(*await drive(reserve, ops, concurrency))
            else:
                s = summary(*await drive(reserve, ops, concurrency))
                f = summary(*await drive(floor, ops, concurrency))
            rows.append((r + 1, f, s))

        # Paired: every worker alternates floor and reserve, so both see the same load at the
        # same moment (the machine is shared: block timings drift from one run to the next).
        paired: dict[str, list[float]] = {"floor": [], "reserve": []}

        async def alternate(i: int) -> None:
            started = time.perf_counter()
            await pool.execute(floor_sql, "", f"{run}-p-{i}", "fp", new_token(), 60.0, 30.0)
            middle = time.perf_counter()
            await store.reserve(f"{run}-p-{i}", "fp", lease_ttl=30, retention=60)
            paired["floor"].append(middle - started)
            paired["reserve"].append(time.perf_counter() - middle)

        await drive(alternate, ops * rounds, concurrency)
    finally:
        await store.close()
        await pool.close()
    lines = [
        f"### concurrency {concurrency} ({ops} fresh keys per run, pool of {concurrency})",
        "",
        "| round | floor p50 ms | floor p99 ms | floor ops/s | reserve p50 ms | reserve p99 ms "
        "| reserve ops/s | p50 ratio | p99 ratio | time/op ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, f, s in rows:
        lines.append(
            f"| {r} | {f['p50_ms']:.3f} | {f['p99_ms']:.3f} | {f['ops_s']:.0f} "
            f"| {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | {s['ops_s']:.0f} "
            f"| {s['p50_ms'] / f['p50_ms']:.2f}x | {s['p99_ms'] / f['p99_ms']:.2f}x "
            f"| {f['ops_s'] / s['ops_s']:.2f}x |"
        )
    med = {
        k: statistics.median(s[k] for _, _, s in rows) / statistics.median(f[k] for _, f, _ in rows)
        for k in ("p50_ms", "p99_ms", "ops_s")
    }
    pf, ps = sorted(paired["floor"]), sorted(paired["reserve"])
    lines.append("")
    lines.append(
        f"Paired ({ops * rounds} alternating floor/reserve ops): floor p50 "
        f"{percentile(pf, 0.5) * 1000:.3f} ms p99 {percentile(pf, 0.99) * 1000:.3f} ms; reserve "
        f"p50 {percentile(ps, 0.5) * 1000:.3f} ms p99 {percentile(ps, 0.99) * 1000:.3f} ms; "
        f"ratio p50 {percentile(ps, 0.5) / percentile(pf, 0.5):.2f}x, "
        f"p99 {percentile(ps, 0.99) / percentile(pf, 0.99):.2f}x, "
        f"mean {statistics.fmean(ps) / statistics.fmean(pf):.2f}x."
    )
    lines.append("")
    lines.append(
        f"Median over rounds, reserve relative to the floor (above 1: slower): p50 "
        f"{med['p50_ms']:.2f}x, p99 {med['p99_ms']:.2f}x, time per op (inverse throughput) "
        f"{1 / med['ops_s']:.2f}x."
    )
    return "\n".join(lines)


async def replay_writes(dsn: str, schema: str, replays: int) -> str:
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    admin = await asyncpg.connect(dsn)
    store = PostgresStore.from_url(url, pool_min_size=1, pool_max_size=1, listen=False)
    try:
        key = f"replay-{uuid.uuid4().hex}"
        first = await store.reserve(key, "fp", lease_ttl=30, retention=600)
        assert first.lease is not None
        await store.complete(first.lease, b'{"ok": true}')

        async def snapshot() -> tuple[int, int, int, int]:
            assert store._pool is not None
            await store._pool.fetchval("SELECT pg_stat_force_next_flush()")
            row = await admin.fetchrow(
                "SELECT n_tup_ins, n_tup_upd, n_tup_del, "
                "pg_current_wal_insert_lsn() - '0/0'::pg_lsn "
                "FROM pg_stat_user_tables WHERE relid = $1::regclass",
                f'"{schema}".idemstore_records',
            )
            return (row[0], row[1], row[2], int(row[3]))

        before = await snapshot()
        latencies = []
        for _ in range(replays):
            started = time.perf_counter()
            replay = await store.reserve(key, "fp", lease_ttl=30, retention=600)
            latencies.append(time.perf_counter() - started)
            assert replay.record is not None and replay.record.response == b'{"ok": true}'
        after = await snapshot()
    finally:
        await store.close()
        await admin.close()
    ordered = sorted(latencies)
    delta = [a - b for a, b in zip(after, before, strict=True)]
    return "\n".join(
        [
            f"### replay ({replays} reserves of one completed key, one connection)",
            "",
            f"- tuples inserted / updated / deleted: {delta[0]} / {delta[1]} / {delta[2]}",
            f"- WAL bytes written meanwhile (whole server, includes the stats calls): {delta[3]}",
            f"- replay latency p50 {percentile(ordered, 0.5) * 1000:.3f} ms, "
            f"p99 {percentile(ordered, 0.99) * 1000:.3f} ms",
        ]
    )


async def wake_latency(dsn: str, schema: str, samples: int) -> str:
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    store = PostgresStore.from_url(url, pool_min_size=2, pool_max_size=4)
    latencies = []
    try:
        for _ in range(samples):
            key = f"wake-{uuid.uuid4().hex}"
            reservation = await store.reserve(key, "fp", lease_ttl=30, retention=60)
            assert reservation.lease is not None
            woke = asyncio.Event()
            woke_at = 0.0

            async def waiter(key: str = key, woke: asyncio.Event = woke) -> None:
                nonlocal woke_at
                await store.wait(key, timeout=10)
                woke_at = time.perf_counter()
                woke.set()

            task = asyncio.create_task(waiter())
            await asyncio.sleep(0.005)  # let the waiter read the record and sleep
            await store.complete(reservation.lease, b"done")
            done_at = time.perf_counter()
            await task
            latencies.append(woke_at - done_at)
    finally:
        await store.close()
    ordered = sorted(latencies)
    return "\n".join(
        [
            f"### wait wake-up ({samples} samples, LISTEN/NOTIFY)",
            "",
            "Time from `complete` returning to the waiter returning (negative: the waiter woke "
            "before the completer got its reply):",
            f"p50 {percentile(ordered, 0.5) * 1000:.3f} ms, "
            f"p99 {percentile(ordered, 0.99) * 1000:.3f} ms, max {ordered[-1] * 1000:.3f} ms",
        ]
    )


async def main(args: argparse.Namespace) -> None:
    server = None
    dsn = args.dsn
    if dsn is None:
        from idemstore.local_servers.postgres import start_postgres

        server = await asyncio.to_thread(start_postgres)
        dsn = server.url
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        migrator = PostgresStore.from_url(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}")
        await migrator.apply_migrations(load_migrations("postgres"))
        await migrator.close()
        admin = await asyncpg.connect(dsn)
        version = await admin.fetchval("SHOW server_version")
        settings = await admin.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers')"
        )
        await admin.execute(
            f'CREATE TABLE "{schema}".floor (LIKE "{schema}".idemstore_records INCLUDING ALL)'
        )
        await admin.close()
        print(f"## PostgresStore.reserve vs raw asyncpg floor (PostgreSQL {version})")
        print()
        print("Server settings: " + ", ".join(f"{r[0]}={r[1]}" for r in settings))
        print()
        # Replays and wake-ups first, on a quiet server: WAL written by autovacuum after the
        # throughput runs would blur the replay's WAL count.
        print(await replay_writes(dsn, schema, 1000))
        print()
        print(await wake_latency(dsn, schema, 200))
        print()
        modes = ["on", "off"] if server is not None else ["server default"]
        for mode in modes:
            if mode != "server default":
                # Commit flushes dominate with synchronous_commit=on; "off" shows what the
                # store itself costs over the floor (function call, lock, extra index probe).
                admin = await asyncpg.connect(dsn)
                await admin.execute(f"ALTER SYSTEM SET synchronous_commit = {mode}")
                await admin.execute("SELECT pg_reload_conf()")
                await admin.close()
            print(f"## synchronous_commit = {mode}")
            print()
            for concurrency in args.concurrency:
                print(await bench_concurrency(dsn, schema, concurrency, args.ops, args.rounds))
                print()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", help="an existing server (default: start a throwaway one)")
    parser.add_argument("--ops", type=int, default=1000, help="operations per run")
    parser.add_argument("--rounds", type=int, default=6, help="floor/reserve rounds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    asyncio.run(main(parser.parse_args()))
