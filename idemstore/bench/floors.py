"""Raw-driver floors: the cheapest write each engine can do for "claim this key once".

A backend is measured against its engine's floor in the same run, so a ratio (backend p50 over
floor p50) survives a noisy machine where absolute numbers do not. Floors talk to the engine
straight from the store URL with the driver the backend uses, never through idemstore code:

- memory: a dict insert;
- SQLite: aiosqlite ``INSERT … ON CONFLICT DO NOTHING`` + ``COMMIT`` in a temporary file beside
  the store's, with WAL and the URL's ``synchronous`` (FULL by default, as the store);
- PostgreSQL: asyncpg ``INSERT … ON CONFLICT DO NOTHING RETURNING`` of a row shaped like the
  store's record (scope, key, fingerprint, status, token, fence, response, timestamps), over
  one pool configured as the store's (same size, no reset query on release);
- Redis: ``SET key value NX PX``, packed once per call and written on redis-py's own
  ``Connection`` objects (a cluster: ``RedisCluster.set``);
- DynamoDB: ``PutItem`` conditioned on ``attribute_not_exists`` in the URL's table.

Where the store completes what it claimed (``fresh``, ``contention``, ``mixed``), the floor
follows an insert with ``finish``, the engine's bare overwrite (``UPDATE``, ``SET XX``,
``UpdateItem``), so two writes are compared with two writes.

Every floor leaves nothing behind: its table, file, items or keys go on ``close``. Which floor
an engine uses is its registry entry's ``floor`` (``idemstore.backends.registry``): a class here, or
anywhere, with ``from_url(url)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from idemstore.backends.registry import engine_for_url, load_target
from idemstore.backends.urls import redact_url, require_driver
from idemstore.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Floor", "floor_for_url"]

# The floor's rows live apart from the store's: their own table, key prefix or temp file.
FLOOR_TABLE = "idemstore_bench_floor"
FLOOR_KEY_PREFIX = "idemstore-bench-floor"

# A floor's Redis keys outlive a crashed run by at most this long.
REDIS_FLOOR_TTL_MS = 600_000

SQLITE_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (key TEXT PRIMARY KEY, value BLOB NOT NULL)"
)
# ON CONFLICT DO NOTHING: a repeated key costs what a replayed reserve costs the engine, a
# uniqueness check, and is not an error.
SQLITE_INSERT = f"INSERT INTO {FLOOR_TABLE} (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING"
SQLITE_FINISH = f"UPDATE {FLOOR_TABLE} SET value = ? WHERE key = ?"

# attribute_not_exists on the partition key: the write lands only when no item holds the key,
# the same condition a reserve of a new key needs.
DYNAMODB_CONDITION = "attribute_not_exists(#pk)"


class Floor(Protocol):
    """One engine's bare "insert if absent"."""

    @property
    def name(self) -> str:
        """What the floor does, e.g. ``aiosqlite INSERT+COMMIT (synchronous=FULL)``."""
        ...

    async def open(self) -> None:
        """Connect and create what the floor writes into."""
        ...

    async def put(self, key: str, value: bytes) -> bool:
        """Insert ``key`` unless present; ``True`` when this call inserted it."""
        ...

    async def finish(self, key: str, value: bytes) -> None:
        """Overwrite the value of a key this floor put: the bare write a ``complete`` is."""
        ...

    async def reset(self) -> None:
        """Between measurements (whose keys never repeat): forget the keys put so far, where
        that does not make the floor's storage unlike the store's (PostgresFloor keeps them)."""
        ...

    async def close(self) -> None:
        """Remove everything the floor created and disconnect; idempotent."""
        ...


class MemoryFloor:
    """A dict: what memory:// costs without records, leases or validation."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    @classmethod
    def from_url(cls, url: str) -> MemoryFloor:
        return cls()

    @property
    def name(self) -> str:
        return "dict insert"

    async def open(self) -> None:
        return None

    async def put(self, key: str, value: bytes) -> bool:
        if key in self._data:
            return False
        self._data[key] = value
        return True

    async def finish(self, key: str, value: bytes) -> None:
        self._data[key] = value

    async def reset(self) -> None:
        self._data.clear()

    async def close(self) -> None:
        self._data.clear()


def _sqlite_path(path: str) -> Path | None:
    """The store file a ``sqlite://`` URL path names, ``None`` for an in-memory database."""
    if path.strip("/") in (":memory:", ""):
        return None
    # Both readings of "sqlite:///x" (absolute "/x", or "x" relative, as SQLAlchemy has it)
    # are tried: only the directory matters, so the floor's file shares the store's disk.
    for candidate in (Path(path), Path(path[1:])):
        if candidate.parent.is_dir():
            return candidate
    return Path(path)


class SQLiteFloor:
    """aiosqlite ``INSERT`` + ``COMMIT`` with the store's pragmas, one writer at a time.

    One connection serves every worker; a lock makes each insert its own transaction, since
    statements of several tasks on one connection would otherwise share one commit and make
    the floor look cheaper than any correct store can be.
    """

    __slots__ = ("_db", "_dir", "_in_memory", "_lock", "_near", "_synchronous")

    def __init__(self, near: Path | None, synchronous: str) -> None:
        self._near = near
        self._in_memory = near is None
        self._synchronous = synchronous
        self._dir: Path | None = None
        self._db: Any = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str) -> SQLiteFloor:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        synchronous = options.get("synchronous", "full").upper()
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(
                f"synchronous must be off, normal, full or extra, not {synchronous.lower()!r}"
            )
        return cls(_sqlite_path(parts.path), synchronous)

    @property
    def name(self) -> str:
        return f"aiosqlite INSERT+COMMIT (WAL, synchronous={self._synchronous})"

    async def open(self) -> None:
        import aiosqlite

        if self._in_memory:
            target = ":memory:"
        else:
            parent = self._near.parent if self._near is not None else None
            where = parent if parent is not None and parent.is_dir() else None
            self._dir = Path(tempfile.mkdtemp(prefix="idemstore-bench-floor-", dir=where))
            target = str(self._dir / "floor.db")
        self._db = await aiosqlite.connect(target)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute(f"PRAGMA synchronous={self._synchronous}")
        await self._db.execute("PRAGMA busy_timeout=5000")
        await self._db.execute(SQLITE_CREATE)
        await self._db.commit()

    async def put(self, key: str, value: bytes) -> bool:
        async with self._lock:
            cursor = await self._db.execute(SQLITE_INSERT, (key, value))
            await self._db.commit()
            return bool(cursor.rowcount == 1)

    async def finish(self, key: str, value: bytes) -> None:
        async with self._lock:
            await self._db.execute(SQLITE_FINISH, (value, key))
            await self._db.commit()

    async def reset(self) -> None:
        async with self._lock:
            await self._db.execute(f"DELETE FROM {FLOOR_TABLE}")
            await self._db.commit()

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def without_query(url: str) -> str:
    """The URL without its query: idemstore options mean nothing to the bare driver."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query="", fragment=""))


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


# The fixed tails of ``SET key value NX PX ms`` and ``SET key value XX PX ms``, packed once:
# a call then packs only its key and value, with one bytes format.
_PX = _bulk(b"PX") + _bulk(b"%d" % REDIS_FLOOR_TTL_MS)
REDIS_SET_NX = b"*6\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" + _bulk(b"NX") + _PX
REDIS_SET_XX = b"*6\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" + _bulk(b"XX") + _PX


class RedisFloor:
    """``SET key value NX PX`` on redis-py's own connections: one round trip, no script.

    On a single server the floor skips redis-py's command layer (pool lock, per-argument
    encoding, ``execute_command``, retries, observability), which the store skips too: each
    call takes a ``Connection`` from a free list (made from the URL's pool settings when the
    list is empty, so it holds as many connections as calls were ever in flight, as the
    store's pool does), writes the command packed as one buffer with ``send_packed_command``
    and reads the reply with ``read_response``. On a cluster it stays redis-py's
    ``RedisCluster.set``, which routes each key to its node.
    """

    __slots__ = ("_all_nodes", "_client", "_factory", "_free", "_made", "_prefix")

    def __init__(self, factory: Callable[[], Any], *, cluster: bool = False) -> None:
        self._factory = factory
        self._all_nodes: dict[str, Any] = {"target_nodes": "all"} if cluster else {}
        self._client: Any = None
        self._prefix = f"{FLOOR_KEY_PREFIX}:{secrets.token_hex(4)}"
        # Idle connections of the single-server path, and all it made (``None``: a cluster).
        self._free: list[Any] | None = None if cluster else []
        self._made: list[Any] = []

    @classmethod
    def from_url(cls, url: str) -> RedisFloor:
        parts = urlsplit(url)
        if parts.scheme.lower() == "redis+cluster":

            def cluster() -> Any:
                from redis.asyncio.cluster import ClusterNode, RedisCluster

                nodes = []
                for node in parts.netloc.rsplit("@", 1)[-1].split(","):
                    host, _, port = node.rpartition(":")
                    nodes.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
                user = parts.username
                return RedisCluster(startup_nodes=nodes, username=user, password=parts.password)

            return cls(cluster, cluster=True)
        plain = without_query(url)

        def single() -> Any:
            import redis.asyncio

            # The client serves ping and INFO; its pool makes the floor's connections.
            return redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool.from_url(plain))

        return cls(single)

    @property
    def name(self) -> str:
        if self._free is None:
            return "redis-py cluster SET NX PX"
        return "redis-py Connection SET NX PX (packed)"

    async def open(self) -> None:
        self._client = self._factory()
        await self._client.ping()

    async def _send(self, command: bytes) -> Any:
        free = self._free
        assert free is not None
        connection = free.pop() if free else self._new_connection()
        try:
            # No health check: a broken connection fails the call, as the store's would.
            await connection.send_packed_command(command, False)
            return await connection.read_response()
        finally:
            # A failure mid-reply leaves it disconnected (redis-py does that); the next call
            # on it reconnects.
            free.append(connection)

    def _new_connection(self) -> Any:
        connection = self._client.connection_pool.make_connection()
        self._made.append(connection)
        return connection

    def _key(self, key: str) -> bytes:
        # The hash tag keeps each floor key in one slot, like a store key, on a cluster.
        return f"{self._prefix}:{{{key}}}".encode()

    async def put(self, key: str, value: bytes) -> bool:
        if self._free is None:
            done = await self._client.set(self._key(key), value, nx=True, px=REDIS_FLOOR_TTL_MS)
            return bool(done)
        packed = self._key(key)
        reply = await self._send(REDIS_SET_NX % (len(packed), packed, len(value), value))
        return reply is not None

    async def finish(self, key: str, value: bytes) -> None:
        if self._free is None:
            await self._client.set(self._key(key), value, xx=True, px=REDIS_FLOOR_TTL_MS)
            return
        packed = self._key(key)
        await self._send(REDIS_SET_XX % (len(packed), packed, len(value), value))

    async def command_counts(self) -> dict[str, int]:
        """Calls per command since the server started, summed over every node of a cluster.

        Commands a script runs inside the server count too (``INFO commandstats`` counts them).
        """
        info: dict[str, Any] = await self._client.info("commandstats", **self._all_nodes)
        # A cluster client answers with one section per node, a single server with one.
        per_node = info and all(isinstance(v, dict) and "calls" not in v for v in info.values())
        sections = list(info.values()) if per_node else [info]
        counts: dict[str, int] = {}
        for section in sections:
            for name, stats in section.items():
                if isinstance(stats, dict) and "calls" in stats:
                    command = name.removeprefix("cmdstat_")
                    if command != "info":  # our own reads of these counters
                        counts[command] = counts.get(command, 0) + int(stats["calls"])
        return counts

    async def reset(self) -> None:
        # New prefix instead of a SCAN + DEL: old keys expire by themselves.
        self._prefix = f"{FLOOR_KEY_PREFIX}:{secrets.token_hex(4)}"

    async def close(self) -> None:
        made, self._made = self._made, []
        if self._free is not None:
            self._free = []
        for connection in made:
            with contextlib.suppress(Exception):
                await connection.disconnect()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class DynamoDBFloor:
    """aiobotocore ``PutItem`` conditioned on ``attribute_not_exists`` in the store's table.

    The table's key schema is read with ``DescribeTable``; the floor's items carry a key
    prefix of their own and are deleted on ``close``.
    """

    __slots__ = (
        "_client",
        "_endpoint_url",
        "_exit",
        "_hash",
        "_put_keys",
        "_range",
        "_region",
        "_run",
        "_table",
    )

    def __init__(self, table: str, region: str | None, endpoint_url: str | None) -> None:
        self._table = table
        self._region = region
        self._endpoint_url = endpoint_url
        self._client: Any = None
        self._exit: Any = None
        self._hash: tuple[str, str] = ("", "S")
        self._range: tuple[str, str] | None = None
        self._put_keys: list[dict[str, Any]] = []
        self._run = secrets.token_hex(4)

    @classmethod
    def from_url(cls, url: str) -> DynamoDBFloor:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        table = (parts.netloc + parts.path).strip("/")
        if not table:
            raise ConfigurationError("a dynamodb:// URL names its table: dynamodb://TABLE?…")
        return cls(table, options.get("region"), options.get("endpoint_url"))

    @property
    def name(self) -> str:
        return "aiobotocore PutItem attribute_not_exists"

    async def open(self) -> None:
        from aiobotocore.session import get_session

        context = get_session().create_client(
            "dynamodb", region_name=self._region, endpoint_url=self._endpoint_url
        )
        self._client = await context.__aenter__()
        self._exit = context.__aexit__
        described = await self._client.describe_table(TableName=self._table)
        table = described["Table"]
        types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
        for element in table["KeySchema"]:
            name = element["AttributeName"]
            if element["KeyType"] == "HASH":
                self._hash = (name, types[name])
            else:
                self._range = (name, types[name])

    def _value(self, kind: str, text: str) -> dict[str, Any]:
        if kind == "S":
            return {"S": text}
        if kind == "B":
            return {"B": text.encode()}
        raise ConfigurationError(f"the floor cannot write a {kind} key attribute")

    async def put(self, key: str, value: bytes) -> bool:
        hash_name, hash_kind = self._hash
        item_key = {hash_name: self._value(hash_kind, f"{FLOOR_KEY_PREFIX}#{self._run}#{key}")}
        if self._range is not None:
            item_key[self._range[0]] = self._value(self._range[1], FLOOR_KEY_PREFIX)
        try:
            await self._client.put_item(
                TableName=self._table,
                Item={**item_key, "bench_value": {"B": value}},
                ConditionExpression=DYNAMODB_CONDITION,
                ExpressionAttributeNames={"#pk": hash_name},
            )
        except self._client.exceptions.ConditionalCheckFailedException:
            return False
        self._put_keys.append(item_key)
        return True

    async def finish(self, key: str, value: bytes) -> None:
        hash_name, hash_kind = self._hash
        item_key = {hash_name: self._value(hash_kind, f"{FLOOR_KEY_PREFIX}#{self._run}#{key}")}
        if self._range is not None:
            item_key[self._range[0]] = self._value(self._range[1], FLOOR_KEY_PREFIX)
        await self._client.update_item(
            TableName=self._table,
            Key=item_key,
            UpdateExpression="SET bench_value = :v",
            ExpressionAttributeValues={":v": {"B": value}},
        )

    async def reset(self) -> None:
        await self._delete_put_items()
        self._run = secrets.token_hex(4)

    async def _delete_put_items(self) -> None:
        keys, self._put_keys = self._put_keys, []
        for start in range(0, len(keys), 25):  # BatchWriteItem takes 25 requests at most
            requests = [{"DeleteRequest": {"Key": key}} for key in keys[start : start + 25]]
            pending: dict[str, Any] = {self._table: requests}
            while pending:
                answer = await self._client.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}

    async def close(self) -> None:
        if self._client is None:
            return
        try:
            with contextlib.suppress(Exception):
                await self._delete_put_items()
        finally:
            self._client = None
            await self._exit(None, None, None)


def floor_for_url(url: str) -> Floor | None:
    """The floor the registry names for ``url``'s engine, ``None`` when it names none.

    Raises ``MissingDependencyError`` when the driver is not installed. Does no I/O.
    """
    engine = engine_for_url(url)
    if engine is None or engine.floor is None:
        return None
    require_driver(engine.driver, engine.extra, f"the {engine.name} floor of {redact_url(url)}")
    floor: Floor = load_target(engine.floor).from_url(url)
    return floor
