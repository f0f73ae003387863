"""Issue 29: ``settle(response, connection=conn)`` records the outcome inside the caller's own
transaction, on Postgres and SQLite: the business write and the completion commit together or
not at all, a stale owner is fenced out before its writes commit, and a connection that cannot
carry the completion is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pytest

from idemstore import (
    ExecutionPolicy,
    Idempotency,
    LeaseLostError,
    OutcomeTooLargeError,
    Replay,
    Status,
    current_execution,
    open_store,
)
from tests.settling.business import Business, open_business
from tests.settling.owners import FP, owned
from tests.settling.refusals import refused_elsewhere, settle_x

if TYPE_CHECKING:
    from idemstore import Execution, IdempotencyStore
    from tests.settling.owners import Takeover


class Boom(Exception):
    pass


def new_key() -> str:
    return f"settle-{uuid.uuid4().hex[:12]}"


async def settle_in_transaction(
    execution: Execution, business: Business, response: bytes, *, commit: bool = True
) -> None:
    """In ``execution``'s block: charge its key and settle in one transaction; commit it, or
    roll it back and raise ``Boom`` (a failure after settling). A refusal rolls back too."""
    async with execution:
        await business.begin()
        try:
            await business.charge(execution.key)
            await execution.settle(response, connection=business.connection)
        except BaseException:
            await business.rollback()
            raise
        if commit:
            await business.commit()
            return
        await business.rollback()
        raise Boom


async def charge_and_settle(execution: Execution, business: Business, response: bytes) -> bool:
    """Open a business transaction, charge ``execution``'s key and settle in it; leave it open
    for the test to commit or roll back."""
    await business.begin()
    await business.charge(execution.key)
    return await execution.settle(response, connection=business.connection)


async def test_the_business_row_and_the_outcome_commit_together(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store)
    key = new_key()
    async with await owned(policy, key) as execution:
        assert await charge_and_settle(execution, business, b"charged")
        assert not execution.settled  # not before the caller's commit
        await business.commit()
    assert execution.settled
    assert await business.charges() == {key: 1}
    replay = await policy.begin(key, FP)
    assert isinstance(replay, Replay)
    assert replay.response == b"charged"


async def test_a_rollback_after_settling_records_nothing_and_releases_the_key(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store, on_failure="release")
    key = new_key()
    execution = await owned(policy, key)
    with pytest.raises(Boom):
        await settle_in_transaction(execution, business, b"charged", commit=False)
    assert await business.charges() == {}
    assert await store.get(key) is None
    again = await owned(policy, key)
    assert not again.takeover
    await again.release()


async def test_a_rollback_after_settling_under_hold_keeps_the_key_only_until_its_lease_lapses(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store, on_failure="hold", lease_ttl=0.5)
    key = new_key()
    execution = await owned(policy, key)
    with pytest.raises(Boom):
        await settle_in_transaction(execution, business, b"charged", commit=False)
    record = await store.get(key)
    assert record is not None and record.status is Status.IN_PROGRESS
    # A waiting caller gets the key once the held lease lapses: nobody owns it forever.
    successor = await owned(ExecutionPolicy(store, in_flight="wait", lease_ttl=5), key)
    assert successor.takeover
    await successor.release()


async def test_a_rollback_swallowed_inside_the_block_leaves_a_key_that_lapses(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store, lease_ttl=0.5)
    async with await owned(policy, new_key()) as execution:
        await charge_and_settle(execution, business, b"charged")
        await business.rollback()
    assert await business.charges() == {}
    successor = await owned(ExecutionPolicy(store, in_flight="wait", lease_ttl=5), execution.key)
    assert successor.takeover
    await successor.release()


async def test_a_stale_owner_gets_lease_lost_and_its_charge_rolls_back(
    takeover: Takeover, store: IdempotencyStore, business: Business
) -> None:
    key, stale, successor, _ = takeover
    with pytest.raises(LeaseLostError):
        await settle_in_transaction(stale, business, b"stale")
    await settle_in_transaction(successor, business, b"fresh")
    assert await business.charges() == {key: 1}
    replay = await ExecutionPolicy(store).begin(key, FP)
    assert isinstance(replay, Replay) and replay.response == b"fresh"


async def test_work_run_by_the_runner_settles_in_its_own_transaction(
    store: IdempotencyStore, business: Business
) -> None:
    idem = Idempotency(store)
    key = new_key()

    async def charge() -> bytes:
        execution = current_execution()
        assert execution is not None
        await charge_and_settle(execution, business, b"receipt")
        await business.commit()
        return b"receipt"

    first = await idem.run(key, FP, charge)
    second = await idem.run(key, FP, charge)
    assert (first.replayed, second.replayed) == (False, True)
    assert second.value == b"receipt"
    assert await business.charges() == {key: 1}


async def test_concurrent_callers_charge_each_key_once(
    store_url: str, store: IdempotencyStore, business: Business
) -> None:
    keys = [new_key() for _ in range(4)]
    connections = [await open_business(store_url) for _ in range(4)]
    policy = ExecutionPolicy(store, in_flight="wait")

    async def caller(key: str, mine: Business) -> bytes:
        claim = await policy.begin(key, FP)
        if isinstance(claim, Replay):
            return claim.response
        await settle_in_transaction(claim, mine, b"ok")
        return b"ok"

    try:
        # One connection serves one caller at a time: each runs its keys in turn.
        async def lane(mine: Business) -> None:
            for key in keys:
                assert await caller(key, mine) == b"ok"

        await asyncio.gather(*(lane(mine) for mine in connections))
    finally:
        for mine in connections:
            await mine.close()
    assert await business.charges() == dict.fromkeys(keys, 1)


# -- refusals ----------------------------------------------------------------------------------


async def test_a_connection_to_another_postgres_database_is_refused(
    postgres_store_url: str, postgres_server: str
) -> None:
    import asyncpg

    name = f"other_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_server)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        parts = urlsplit(postgres_store_url)
        other_url = urlunsplit(parts._replace(path=f"/{name}"))
        message = await refused_elsewhere(postgres_store_url, other_url, settle_x)
        assert f"database {name!r}" in message
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.close()


# -- PostgreSQL connections ----------------------------------------------------------------------


async def test_a_connection_acquired_from_an_asyncpg_pool_is_checked_once_then_only_completes(
    postgres_store_url: str, postgres_server: str
) -> None:
    import asyncpg

    schema = dict(parse_qsl(urlsplit(postgres_store_url).query))["schema"]
    statements: list[str] = []
    async with (
        open_store(postgres_store_url) as store,
        asyncpg.create_pool(postgres_server, min_size=1, max_size=1) as pool,
    ):
        policy = ExecutionPolicy(store)
        async with pool.acquire() as conn:  # the pool's one session, logged from now on
            await conn.execute(f'CREATE TABLE "{schema}".charges (key text)')
            conn.add_query_logger(lambda query: statements.append(query.query))
        for key in (new_key(), new_key()):
            async with (
                await owned(policy, key) as execution,
                pool.acquire() as conn,
                conn.transaction(),
            ):
                await conn.execute(f'INSERT INTO "{schema}".charges VALUES ($1)', key)
                await execution.settle(b"ok", connection=conn)
            assert execution.settled
        count = await pool.fetchval(f'SELECT count(*) FROM "{schema}".charges')
        await asyncio.sleep(0)  # query loggers are called soon after each query
    assert count == 2
    # Two settlements, one identity check for the session: no extra round trip once known.
    assert sum("pg_postmaster_start_time" in q for q in statements) == 1
    assert sum(q == store._sql["complete"] for q in statements) == 2


async def test_an_outcome_over_max_response_bytes_commits_as_too_large_with_the_charge(
    store: IdempotencyStore, business: Business
) -> None:
    policy = ExecutionPolicy(store, max_response_bytes=4)
    async with await owned(policy, new_key()) as execution:
        assert not await charge_and_settle(execution, business, b"far too long")
        await business.commit()
    assert await business.charges() == {execution.key: 1}
    # The charge happened: retries learn its outcome was too large, and never charge again.
    with pytest.raises(OutcomeTooLargeError):
        await policy.begin(execution.key, FP)


async def test_a_stale_owner_that_catches_lease_lost_is_finished_and_not_settled(
    takeover: Takeover, business: Business
) -> None:
    key, stale, successor, _ = takeover
    async with stale:
        await business.begin()
        await business.charge(key)
        with pytest.raises(LeaseLostError):
            await stale.settle(b"stale", connection=business.connection)
        await business.rollback()
    assert stale.finished and not stale.settled
    await settle_in_transaction(successor, business, b"fresh")
    assert await business.charges() == {key: 1}
