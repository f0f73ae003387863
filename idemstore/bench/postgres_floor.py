"""The PostgreSQL floor: what a user would write by hand for "claim this key once".

asyncpg ``INSERT … ON CONFLICT DO NOTHING RETURNING`` of a row shaped like the store's record,
then the holder's ``UPDATE``, over one pool configured as the store's. See ``floors`` for what a
floor is and how the bench uses it.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from idemstore.bench.floors import FLOOR_TABLE, without_query
from idemstore.errors import ConfigurationError

__all__ = ["PostgresFloor", "quote_schema"]

# A logged table shaped like the store's record, as a user would write it by hand: the same
# columns (the response bytea included), a primary key on the identity, no secondary index.
# Logged, as the store's is: its commits pay for the WAL flush, so the floor's must.
POSTGRES_CREATE = f"""CREATE TABLE IF NOT EXISTS {FLOOR_TABLE}_{{run}} (
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    fingerprint      text NOT NULL,
    status           text NOT NULL,
    token            text NOT NULL,
    fence            bigint NOT NULL,
    response         bytea,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    lease_expires_at timestamptz,
    checkpoints      bytea,
    PRIMARY KEY (scope, key))"""
# The claim: insert the in-progress row unless the identity exists, and learn which happened
# from RETURNING, as reserve does for a new key.
POSTGRES_INSERT = f"""INSERT INTO {FLOOR_TABLE}_{{run}}
       (scope, key, fingerprint, status, token, fence, created_at, expires_at, lease_expires_at)
VALUES ($1, $2, $3, 'in_progress', $4, 1, now(), now() + make_interval(secs => $5),
        now() + make_interval(secs => $6))
ON CONFLICT DO NOTHING RETURNING fence"""
# The completion: the holder (token and fence) stores its response, as complete does.
POSTGRES_FINISH = f"""UPDATE {FLOOR_TABLE}_{{run}}
   SET status = 'completed', response = $5, lease_expires_at = NULL,
       expires_at = now() + make_interval(secs => $6)
 WHERE scope = $1 AND key = $2 AND token = $3 AND fence = $4 AND status = 'in_progress'"""
# Constants of the floor's rows, the same in kind as the bench's store calls.
POSTGRES_SCOPE = "bench"
POSTGRES_FINGERPRINT = "0" * 64
POSTGRES_LEASE_SECONDS = 30.0
POSTGRES_RETENTION_SECONDS = 3600.0
POSTGRES_DROP = f"DROP TABLE IF EXISTS {FLOOR_TABLE}_{{run}}"
POSTGRES_WRITE_COUNTERS = (
    "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
    " (SELECT xmin::text || ctid::text FROM {s}.idemstore_records"
    " WHERE scope = $1 AND key = $2)"
)


def quote_schema(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _leave_session_as_is(connection: Any) -> None:
    """Pool ``reset`` that sends nothing: the floor leaves no session state behind, and
    asyncpg's default reset (``RESET ALL``, ``UNLISTEN *``…) would add a round trip to every
    release, which the store's pool does not pay either."""


class PostgresFloor:
    """asyncpg ``INSERT … ON CONFLICT DO NOTHING RETURNING`` of a record-shaped row, then the
    holder's ``UPDATE``, over one pool configured as the store's: the URL's ``pool_min_size``
    and ``pool_max_size`` (1 and 10 by default), ``statement_cache_size``, no reset query on
    release."""

    __slots__ = (
        "_dsn",
        "_pool",
        "_pool_min_size",
        "_pool_size",
        "_run",
        "_schema",
        "_statement_cache_size",
        "_tokens",
    )

    def __init__(
        self,
        dsn: str,
        pool_size: int,
        schema: str = "public",
        *,
        pool_min_size: int = 1,
        statement_cache_size: int = 100,
    ) -> None:
        self._dsn = dsn
        self._schema = schema
        self._pool_size = pool_size
        self._pool_min_size = min(pool_min_size, pool_size)
        self._statement_cache_size = statement_cache_size
        self._pool: Any = None
        self._run = secrets.token_hex(4)
        # The token each claimed key's UPDATE must match, as a lease carries its token.
        self._tokens: dict[str, str] = {}

    @classmethod
    def from_url(cls, url: str) -> PostgresFloor:
        options = dict(parse_qsl(urlsplit(url).query))
        sizes = {}
        for name, default in (
            ("pool_max_size", 10),
            ("pool_min_size", 1),
            ("statement_cache_size", 100),
        ):
            try:
                sizes[name] = int(options.get(name, default))
            except ValueError:
                raise ConfigurationError(f"option {name} must be an integer") from None
        schema = options.get("schema", "public")
        return cls(
            without_query(url),
            max(1, sizes["pool_max_size"]),
            schema,
            pool_min_size=max(0, sizes["pool_min_size"]),
            statement_cache_size=max(0, sizes["statement_cache_size"]),
        )

    @property
    def name(self) -> str:
        return "asyncpg INSERT … ON CONFLICT DO NOTHING RETURNING + UPDATE"

    def _sql(self, template: str) -> str:
        return template.format(run=self._run)

    async def open(self) -> None:
        import asyncpg

        self._pool = await asyncpg.create_pool(
            self._dsn,
            min_size=self._pool_min_size,
            max_size=self._pool_size,
            command_timeout=30,
            statement_cache_size=self._statement_cache_size,
            reset=_leave_session_as_is,
        )
        await self._pool.execute(self._sql(POSTGRES_CREATE))

    async def put(self, key: str, value: bytes) -> bool:
        # No response yet (``value`` goes in with ``finish``), as a reserve writes none.
        token = secrets.token_hex(16)
        fence = await self._pool.fetchval(
            self._sql(POSTGRES_INSERT),
            POSTGRES_SCOPE,
            key,
            POSTGRES_FINGERPRINT,
            token,
            POSTGRES_RETENTION_SECONDS,
            POSTGRES_LEASE_SECONDS,
        )
        if fence is None:
            return False
        self._tokens[key] = token
        return True

    async def finish(self, key: str, value: bytes) -> None:
        token = self._tokens.pop(key, "")
        await self._pool.execute(
            self._sql(POSTGRES_FINISH),
            POSTGRES_SCOPE,
            key,
            token,
            1,
            value,
            POSTGRES_RETENTION_SECONDS,
        )

    async def reset(self) -> None:
        # Nothing: every measurement's keys are new, and the store's table is never emptied
        # either. TRUNCATE would hand the floor a brand-new file each time, whose first pages
        # cost (relation extension) what the store's grown table no longer pays, and
        # measured ratios drifted by up to 2x with it; both tables now grow alike.
        self._tokens.clear()

    async def write_counters(self, scope: str, key: str) -> dict[str, int]:
        """The server's WAL position (bytes) and the version of the store's row for
        ``(scope, key)`` (its ``xmin`` and ``ctid``, hashed): any rewrite of the row, even to
        the same values, changes the version; any write anywhere moves the WAL position.

        Read at once, unlike the statistics views, which other sessions publish up to 10 s
        late.
        """
        sql = POSTGRES_WRITE_COUNTERS.format(s=quote_schema(self._schema))
        row = await self._pool.fetchrow(sql, scope, key)
        return {"wal_bytes": int(row[0]), "row_version": hash(row[1])}

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.execute(self._sql(POSTGRES_DROP))
            await pool.close()
