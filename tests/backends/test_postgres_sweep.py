"""The PostgreSQL sweep walks the records table chunk by chunk of pages (there is no index on
``expires_at`` since schema version 6): what a sweep stopped by its limit resumes, and that a
sweep which returns less than its limit has removed every expired row it could lock, whatever
order the server's scans return rows in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from idemstore import open_store
from idemstore.local_servers.postgres import start_postgres
from idemstore.testing.fixtures import running
from idemstore.testing.fixtures.postgres import with_options

asyncpg = pytest.importorskip("asyncpg")

from idemstore.backends.postgres import PostgresStore  # noqa: E402
from idemstore.backends.postgres.statements import quote_ident  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# Rows of 1,500 incompressible bytes (under the TOAST threshold): four to a page.
ROW_BYTES = 1500
# Inserts a record per n in [$1, $2): completed, its retention past for every n % $3 = 0.
FILL = """
INSERT INTO {table} (scope, key, fingerprint, status, released, token, fence, response,
                     created_at, expires_at, id)
SELECT '', 'k' || n, 'fp', 'completed', false, 't', 1,
       decode(repeat(md5(n::text), {repeats}), 'hex'), clock_timestamp(),
       clock_timestamp() + CASE WHEN n % $3 = 0 THEN interval '-1 second'
                                ELSE interval '1 hour' END,
       {schema}.idemstore_id('', 'k' || n)
  FROM generate_series($1::int, $2::int - 1) AS n"""


def table_of(url: str) -> tuple[str, str]:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    schema = quote_ident(store._schema)
    return schema, f"{schema}.idemstore_records"


async def fill(admin: Any, url: str, first: int, end: int, every: int) -> None:
    schema, table = table_of(url)
    sql = FILL.format(table=table, schema=schema, repeats=ROW_BYTES // 16)
    await admin.execute(sql, first, end, every)


async def expired_pages(admin: Any, table: str) -> list[int]:
    rows = await admin.fetch(
        f"SELECT (ctid::text::point)[0]::int FROM {table} WHERE expires_at <= clock_timestamp()"
    )
    return sorted(row[0] for row in rows)


@pytest.fixture
async def admin(postgres_server: str) -> AsyncIterator[Any]:
    connection = await asyncpg.connect(postgres_server)
    yield connection
    await connection.close()


async def test_a_sweep_stopped_by_its_limit_resumes_in_the_chunk_it_stopped_in(
    postgres_store_url: str, admin: Any
) -> None:
    """With one page a chunk: rows on the first page, locked, are passed by; the sweep that
    reached its limit on the second page is resumed there by the next one, which goes on to
    the third before it wraps round to the first."""
    _, table = table_of(postgres_store_url)
    await fill(admin, postgres_store_url, 0, 12, every=1)  # twelve expired rows, pages 0-2
    assert await expired_pages(admin, table) == [0] * 4 + [1] * 4 + [2] * 4
    store = open_store(postgres_store_url, sweep_batch_size=2)
    assert isinstance(store, PostgresStore)
    store._sweeping.chunk_pages = 1
    async with store:
        async with admin.transaction():
            await admin.execute(
                f"SELECT 1 FROM {table} WHERE (ctid::text::point)[0] = 0 FOR UPDATE"
            )
            assert await store.sweep(limit=3) == 3  # the first page's rows are locked
            assert await expired_pages(admin, table) == [0] * 4 + [1] + [2] * 4
        assert await store.sweep(limit=5) == 5  # page 1's last row, then page 2
        assert await expired_pages(admin, table) == [0] * 4
        assert await store.sweep(limit=1000) == 4  # wrapped round to page 0
        assert await store.sweep(limit=1000) == 0


@pytest.mark.slow
async def test_a_sweep_removes_every_expired_row_when_scans_start_mid_table() -> None:
    """A server without TID range scans (PostgreSQL 13 and older, here one that disables them)
    runs each batch as a sequential scan, and a table larger than a quarter of shared_buffers
    is scanned from wherever another scan of it last was (synchronized scans). A sweep that
    resumed after the last row a batch deleted skipped the rows before that point: found in
    review, reproduced here through a plain mid-table read before the sweep."""
    with running("postgres", lambda: start_postgres(settings={"enable_tidscan": "off"})) as pg:
        url = with_options(pg.url, auto_migrate="true", schema="idem_sweep")
        async with open_store(url, sweep_batch_size=500) as store:
            assert await store.ping() is None
            _, table = table_of(url)
            admin = await asyncpg.connect(pg.url)
            try:
                # 24,000 rows of 1.5 KB: about 48 MB, past 64 MB / 4; every 7th is expired.
                for first in range(0, 24_000, 4_000):
                    await fill(admin, url, first, first + 4_000, every=7)
                expired = len(await expired_pages(admin, table))
                # A read that stops mid-table leaves the synchronized-scan start point there.
                await admin.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT 12000) r")
                assert await store.sweep(limit=10**6) == expired
                assert await expired_pages(admin, table) == []
            finally:
                await admin.close()
