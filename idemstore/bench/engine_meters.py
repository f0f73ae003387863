"""What an engine holds and what it did, read from the engine itself: the ``cost`` scenario's
instruments.

A meter reads two things, through a connection of its own (never the store's state):

- ``held()``: bytes the engine holds for the store, by measure (Redis ``INFO memory``
  ``used_memory`` and the ``MEMORY USAGE`` of the store's keys; PostgreSQL
  ``pg_total_relation_size`` of the records table, heap + indexes + TOAST; SQLite
  ``page_count * page_size`` of the file; the memory store's traced allocations);
- ``activity()``: counters that only grow (Redis reads, commands, CPU seconds and network
  bytes from ``INFO``; PostgreSQL's WAL position, its committed and rolled-back transactions
  and, where the server runs on this machine, its processes' CPU seconds from ``/proc``; the
  process CPU of an embedded engine).

The scenario takes deltas of both around a phase of calls. DynamoDB has no engine-side
counter a client can read (moto's least of all): its costs are computed from the items it
holds by AWS's rules (``dynamodb_units``), and its meter reads those items.
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from idemstore.backends.registry import engine_for_url
from idemstore.backends.urls import open_store
from idemstore.bench.dynamodb_units import item_bytes
from idemstore.bench.floors import without_query
from idemstore.bench.postgres_floor import quote_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["DynamoDBMeter", "Meter", "RedisMeter", "meter_for"]

RECORDS_TABLE = "idemstore_records"
# PostgreSQL: what the records table takes on disk, by part, and the activity counters.
POSTGRES_HELD = """
SELECT pg_total_relation_size(t), pg_relation_size(t), pg_indexes_size(t)
FROM (SELECT $1::text::regclass AS t) AS records
"""
POSTGRES_ACTIVITY = """
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit + xact_rollback
FROM pg_stat_database WHERE datname = current_database()
"""
# Redis INFO fields read by activity(), under the names the scenario reports.
REDIS_COUNTERS = {
    "total_reads_processed": "round_trips",
    "total_commands_processed": "commands",
    "total_net_input_bytes": "bytes_in",
    "total_net_output_bytes": "bytes_out",
}


class Meter(Protocol):
    """One engine's instruments; see the module docstring."""

    async def open(self) -> None: ...

    async def held(self) -> dict[str, float]: ...

    async def activity(self) -> dict[str, float]: ...

    async def close(self) -> None: ...


class _ProcessMeter:
    """An engine inside this process: its CPU is the process's."""

    async def open(self) -> None:
        return None

    async def activity(self) -> dict[str, float]:
        return {"cpu_seconds": time.process_time()}

    async def close(self) -> None:
        return None


class _MemoryMeter(_ProcessMeter):
    """The memory store: allocations traced while it holds the records."""

    def __init__(self) -> None:
        self._started = False

    async def open(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started = True

    async def held(self) -> dict[str, float]:
        return {"bytes": float(tracemalloc.get_traced_memory()[0])}

    async def close(self) -> None:
        if self._started:
            tracemalloc.stop()


class _SQLiteMeter(_ProcessMeter):
    """A SQLite file: its pages, as a second connection sees them (WAL frames included)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    async def held(self) -> dict[str, float]:
        import sqlite3

        connection = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True)
        try:
            pages = connection.execute("PRAGMA page_count").fetchone()[0]
            size = connection.execute("PRAGMA page_size").fetchone()[0]
        finally:
            connection.close()
        return {"bytes": float(pages * size)}


class RedisMeter:
    """A single Redis server: ``INFO`` counters and the ``MEMORY USAGE`` of the store's keys."""

    def __init__(self, url: str, locate: Callable[[str, str], bytes]) -> None:
        self._url = without_query(url)
        self._locate = locate  # the store's storage_key: where (scope, key) is kept
        self._client: Any = None

    async def open(self) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(self._url)

    async def held(self) -> dict[str, float]:
        info = await self._client.info("memory")
        return {"bytes": float(info["used_memory"])}

    async def key_bytes(self, scope: str, keys: Sequence[str]) -> int:
        """``MEMORY USAGE`` summed over the record keys of ``(scope, key)`` for ``keys``."""
        total = 0
        for start in range(0, len(keys), 500):
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys[start : start + 500]:
                    pipe.memory_usage(self._locate(scope, key), samples=0)
                total += sum(n or 0 for n in await pipe.execute())
        return total

    async def activity(self) -> dict[str, float]:
        info = await self._client.info("everything")
        counters = {name: float(info[field]) for field, name in REDIS_COUNTERS.items()}
        # This INFO is itself one read and one command; the one before it was counted then.
        counters["round_trips"] -= 1
        counters["commands"] -= 1
        counters["cpu_seconds"] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return counters

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _cpu_of(pid: int) -> tuple[float, int] | None:
    """CPU seconds of ``pid`` and of its reaped children, and its parent's pid, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # After the ")": state, ppid, ... utime (12th), stime, cutime, cstime.
    return sum(int(f) for f in fields[11:15]) / ticks, int(fields[1])


def _server_cpu(postmaster: int) -> float | None:
    """CPU seconds of a PostgreSQL server on this machine: the postmaster (with the backends
    it has reaped) and its live children."""
    own = _cpu_of(postmaster)
    if own is None:
        return None
    total = own[0]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            child = _cpu_of(int(entry.name))
            if child is not None and child[1] == postmaster:
                total += child[0]
    return total


class _PostgresMeter:
    """A PostgreSQL database: the records table's size, WAL position, transaction count, and
    the server's CPU where it runs here and its data directory is readable."""

    def __init__(self, url: str, schema: str) -> None:
        self._dsn = without_query(url)
        self._table = f"{quote_schema(schema)}.{RECORDS_TABLE}"
        self._connection: Any = None
        self._postmaster: int | None = None

    async def open(self) -> None:
        import asyncpg

        self._connection = await asyncpg.connect(self._dsn)
        try:
            directory = await self._connection.fetchval("SHOW data_directory")
            pid_file = Path(directory) / "postmaster.pid"
            self._postmaster = int(pid_file.read_text().split("\n", 1)[0])
        except Exception:  # not a superuser, or not this machine: no CPU figure
            self._postmaster = None

    async def held(self) -> dict[str, float]:
        total, heap, indexes = await self._connection.fetchrow(POSTGRES_HELD, self._table)
        return {"bytes": float(total), "heap_bytes": float(heap), "index_bytes": float(indexes)}

    async def activity(self) -> dict[str, float]:
        # Other sessions publish their transaction counts when they end (the scenario closes
        # its store before reading) or up to seconds later: a fresh snapshot is needed.
        await self._connection.execute("SELECT pg_stat_clear_snapshot()")
        wal, transactions = await self._connection.fetchrow(POSTGRES_ACTIVITY)
        counters = {"wal_bytes": float(wal), "transactions": float(transactions)}
        if self._postmaster is not None:
            cpu = await asyncio.to_thread(_server_cpu, self._postmaster)
            if cpu is not None:
                counters["cpu_seconds"] = cpu
        return counters

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


class DynamoDBMeter:
    """A DynamoDB table: the items the store wrote, sized by AWS's rules."""

    def __init__(self, url: str, locate: Callable[[str, str], dict[str, Any]]) -> None:
        self._locate = locate  # the store's storage_key: the item's primary key
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        self._table = (parts.netloc + parts.path).strip("/")
        self._region = options.get("region")
        self._endpoint_url = options.get("endpoint_url")
        self._client: Any = None
        self._exit: Any = None

    async def open(self) -> None:
        from aiobotocore.session import get_session

        context = get_session().create_client(
            "dynamodb", region_name=self._region, endpoint_url=self._endpoint_url
        )
        self._client = await context.__aenter__()
        self._exit = context.__aexit__

    async def held(self) -> dict[str, float]:
        return {}

    async def activity(self) -> dict[str, float]:
        return {}

    async def item_sizes(self, scope: str, keys: Sequence[str]) -> list[int]:
        """The size of the item of each ``(scope, key)``, by AWS's item-size rules."""
        sizes = []
        for key in keys:
            answer = await self._client.get_item(
                TableName=self._table, Key=self._locate(scope, key), ConsistentRead=True
            )
            sizes.append(item_bytes(answer["Item"]))
        return sizes

    async def close(self) -> None:
        if self._exit is not None:
            await self._exit(None, None, None)


def meter_for(url: str) -> Meter:
    """The meter of the engine ``url`` names; ``ValueError`` when there is none for it."""
    engine = engine_for_url(url)
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    name = None if engine is None else engine.name
    if name == "memory":
        return _MemoryMeter()
    if name == "sqlite" and parts.path.strip("/") not in ("", ":memory:"):
        return _SQLiteMeter(Path(parts.path[1:]))
    if name == "postgres":
        return _PostgresMeter(url, options.get("schema", "public"))
    if name == "redis" and parts.scheme in ("redis", "rediss"):
        return RedisMeter(url, _locator(url))
    if name == "dynamodb":
        return DynamoDBMeter(url, _locator(url))
    raise ValueError(
        f"no cost meter for {parts.scheme}:// (memory, a SQLite file, PostgreSQL, a single"
        " Redis server and DynamoDB have one)"
    )


def _locator(url: str) -> Any:
    """The ``storage_key`` of the store ``url`` names: the engine's own layout, read through
    the store (building it does no I/O), so the bench names no engine module."""
    return open_store(url).storage_key  # type: ignore[attr-defined]
