"""Latency of ``reserve`` + ``complete`` on the SQLite store, against a bare aiosqlite floor.

    PYTHONPATH=. python benchmarks/sqlite_latency.py [--ops 2000] [--rounds 5] [--dir DIR]

Measures, in one run and interleaved round by round (so a noisy neighbour hurts every variant
alike), one sequential caller doing:

- ``store full``: ``reserve`` then ``complete`` of a fresh key, ``synchronous=FULL`` (default);
- ``store normal``: the same with ``?synchronous=normal``;
- ``bare full`` / ``bare normal``: one ``INSERT`` + ``commit()`` on a table with the same
  columns and indexes through aiosqlite with the same pragmas: the floor for ONE durable
  write transaction;
- ``aiosqlite hop``: ``SELECT 1``, one round trip to aiosqlite's thread and back (a write
  transaction of the store makes three: BEGIN IMMEDIATE, the statement, COMMIT).

``reserve`` + ``complete`` is two write transactions, so twice the bare floor is the least it
can cost. ``--dir`` must be on a real disk (not tmpfs), or fsync costs nothing. A benchmark, not
a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import aiosqlite

from idemstore.backends.sqlite import SQLiteStore

BARE_TABLE = """CREATE TABLE IF NOT EXISTS bare (
    scope TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL,
    token TEXT NOT NULL, fence INTEGER NOT NULL, response BLOB, created_at REAL NOT NULL,
    expires_at REAL NOT NULL, lease_expires_at REAL, UNIQUE (scope, key))"""
BARE_INDEX = "CREATE INDEX IF NOT EXISTS bare_expires_at ON bare (expires_at)"
BARE_INSERT = "INSERT INTO bare VALUES ('', ?, 'fp', 'completed', ?, 1, ?, ?, ?, NULL)"
RESPONSE = b'{"status": "charged", "amount": 1999}'


async def store_ops(store: SQLiteStore, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        key = uuid.uuid4().hex
        started = time.perf_counter()
        reservation = await store.reserve(key, "fp", lease_ttl=30, retention=3600)
        assert reservation.lease is not None
        assert await store.complete(reservation.lease, RESPONSE)
        samples.append(time.perf_counter() - started)
    return samples


async def bare_ops(conn: aiosqlite.Connection, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        now = time.time()
        started = time.perf_counter()
        await conn.execute(BARE_INSERT, (uuid.uuid4().hex, uuid.uuid4().hex, RESPONSE, now, now))
        await conn.commit()
        samples.append(time.perf_counter() - started)
    return samples


async def open_bare(path: Path, synchronous: str) -> aiosqlite.Connection:
    conn = await aiosqlite.connect(path)
    await conn.execute("PRAGMA journal_mode = WAL")
    await conn.execute(f"PRAGMA synchronous = {synchronous}")
    await conn.execute(BARE_TABLE)
    await conn.execute(BARE_INDEX)
    await conn.commit()
    return conn


async def hop_ops(conn: aiosqlite.Connection, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await conn.execute_fetchall("SELECT 1")
        samples.append(time.perf_counter() - started)
    return samples


def describe(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * len(ms)) - 1)]
    return (
        f"{name:<14} n={len(ms):<6} p50={p50:7.3f} ms  p99={p99:7.3f} ms  "
        f"mean={statistics.fmean(ms):7.3f} ms  max={ms[-1]:7.3f} ms"
    )


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    per_round = max(1, args.ops // args.rounds)

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="idemstore-bench-") as where:
        root = Path(where)
        stores = {
            "store full": SQLiteStore(str(root / "full.db"), synchronous="full"),
            "store normal": SQLiteStore(str(root / "normal.db"), synchronous="normal"),
        }
        bares = {
            "bare full": await open_bare(root / "bare_full.db", "FULL"),
            "bare normal": await open_bare(root / "bare_normal.db", "NORMAL"),
        }
        samples: dict[str, list[float]] = {name: [] for name in [*stores, *bares]}
        try:
            for store in stores.values():
                await store_ops(store, 50)  # warm up: open, migrate, first pages
            for conn in bares.values():
                await bare_ops(conn, 50)
            for _ in range(args.rounds):
                for name, store in stores.items():
                    samples[name] += await store_ops(store, per_round)
                for name, conn in bares.items():
                    samples[name] += await bare_ops(conn, per_round)
                samples.setdefault("aiosqlite hop", [])
                samples["aiosqlite hop"] += await hop_ops(bares["bare full"], per_round)
        finally:
            for store in stores.values():
                await store.close()
            for conn in bares.values():
                await conn.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per variant")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--dir", default=".", help="where the database files go (a real disk)")
    args = parser.parse_args()
    samples = asyncio.run(measure(args))
    print(
        f"SQLite {sqlite3.sqlite_version}, aiosqlite {aiosqlite.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"files in {os.path.abspath(args.dir)}"
    )
    print("one sequential caller; store = reserve + complete (2 write transactions);")
    print("bare = one INSERT + commit (1 write transaction)")
    for name, values in samples.items():
        print(describe(name, values))


if __name__ == "__main__":
    main()
