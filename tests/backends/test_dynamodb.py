"""DynamoDB-specific behaviour, against moto's server over real HTTP (the contract suite
covers everything every backend shares)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import (
    ConfigurationError,
    Outcome,
    ResponseTooLargeError,
    SchemaError,
    Status,
    StoreUnavailableError,
    open_store,
)
from idemstore.backends.dynamodb import DynamoDBStore
from idemstore.backends.dynamodb.items import ITEM_LIMIT
from idemstore.checkpoints import MAX_CHECKPOINT_DATA, MAX_CHECKPOINTS
from idemstore.local_servers import free_port
from idemstore.testing import FakeClock, FaultProxy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

    from idemstore import Lease

FP = "fp-a"
LONG = 60.0


def counting_session() -> tuple[Any, Counter[str]]:
    """An aiobotocore session that counts HTTP requests (each attempt) per operation."""
    from aiobotocore.session import AioSession

    session = AioSession()
    sent: Counter[str] = Counter()

    def before_send(request: Any, **_: Any) -> None:
        sent[request.headers["X-Amz-Target"].decode().rsplit(".", 1)[1]] += 1

    session.register("before-send.dynamodb", before_send)
    return session, sent


@pytest.fixture
async def store(dynamodb_store_url: str) -> AsyncIterator[DynamoDBStore]:
    async with DynamoDBStore.from_url(dynamodb_store_url) as opened:
        yield opened


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


async def acquire(store: DynamoDBStore, key: str, lease_ttl: float = LONG) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=LONG)
    assert reservation.lease is not None
    return reservation.lease


def raw_item(admin: Any, table: str, store: DynamoDBStore, key: str, scope: str = "") -> Any:
    from idemstore.backends.dynamodb.items import partition_key

    return admin.get_item(TableName=table, Key=partition_key(scope, key), ConsistentRead=True).get(
        "Item"
    )


# -- one request per operation --------------------------------------------------------------


async def test_every_operation_is_one_http_request(dynamodb_store_url: str) -> None:
    session, sent = counting_session()
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session, clock=clock) as store:

        async def counted(operation: Awaitable[Any]) -> tuple[Any, int]:
            sent.clear()
            result = await operation
            return result, sum(sent.values())

        key, other = new_key(), new_key()
        fresh, n = await counted(store.reserve(key, FP, lease_ttl=1, retention=LONG))
        assert fresh.outcome is Outcome.ACQUIRED and n == 1
        lost, n = await counted(store.reserve(key, FP, lease_ttl=1, retention=LONG))
        assert lost.outcome is Outcome.IN_PROGRESS and lost.record is not None and n == 1
        mismatch, n = await counted(store.reserve(key, "other", lease_ttl=1, retention=LONG))
        assert mismatch.outcome is Outcome.MISMATCH and n == 1
        clock.offset = 5.0  # the lease lapsed: a takeover is one request too
        taken, n = await counted(store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        assert taken.takeover and n == 1
        extended, n = await counted(store.extend(taken.lease, lease_ttl=LONG))
        assert extended is not None and n == 1
        record, n = await counted(store.get(key))
        assert record is not None and n == 1
        done, n = await counted(store.complete(taken.lease, b"done"))
        assert done is True and n == 1
        replay, n = await counted(store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        assert replay.outcome is Outcome.COMPLETED and replay.record.response == b"done"
        assert n == 1
        first = await acquire(store, other)
        released, n = await counted(store.release(first))
        assert released is True and n == 1
        again, n = await counted(store.reserve(other, FP, lease_ttl=LONG, retention=LONG))
        assert again.lease is not None and again.lease.fence == 2 and n == 1
        deleted, n = await counted(store.delete(key))
        assert deleted is True and n == 1
        _, n = await counted(store.ping())
        assert n == 1


async def test_a_key_another_store_left_replaceable_costs_a_put_then_the_update(
    dynamodb_store_url: str,
) -> None:
    session, sent = counting_session()
    key, done = new_key(), new_key()
    async with DynamoDBStore.from_url(dynamodb_store_url) as other:
        assert await other.release(await acquire(other, key)) is True
        assert await other.complete(await acquire(other, done), b"ok") is True
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert again.lease is not None and again.lease.fence == 2
        # (moto answers a failed PutItem without the item: _failed_item reads it.)
        assert sent["PutItem"] == 1 and sent["UpdateItem"] == 1
        sent.clear()
        replay = await store.reserve(done, FP, lease_ttl=LONG, retention=LONG)
        assert replay.outcome is Outcome.COMPLETED and replay.record is not None
        assert replay.record.response == b"ok" and sent["PutItem"] == 1
        assert "UpdateItem" not in sent


async def test_a_role_without_put_item_still_reserves_through_the_update(
    dynamodb_store_url: str,
) -> None:
    session, sent = counting_session()

    def denied(**_: Any) -> tuple[Any, dict[str, Any]]:
        error = {"Code": "AccessDeniedException", "Message": "not authorized: PutItem"}
        return SimpleNamespace(status_code=400), {"Error": error, "ResponseMetadata": {}}

    session.register("before-call.dynamodb.PutItem", denied)
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        first = await acquire(store, new_key())
        second = await acquire(store, new_key())
    assert first.fence == second.fence == 1
    assert sent["UpdateItem"] == 2 and "PutItem" not in sent  # asked once, then no more


async def test_a_store_uses_one_client_for_all_its_requests(dynamodb_store_url: str) -> None:
    session, _ = counting_session()
    created: list[str] = []
    session.register("creating-client-class.dynamodb", lambda **_: created.append("client"))
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        await asyncio.gather(
            *(store.reserve(new_key(), FP, lease_ttl=5, retention=5) for _ in range(20))
        )
        await store.get(new_key())
    assert created == ["client"]


# -- races with real concurrent callers -----------------------------------------------------


async def test_concurrent_takeovers_of_a_lapsed_lease_acquire_exactly_once(
    dynamodb_store_url: str,
) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as store:
        key = new_key()
        first = await acquire(store, key, lease_ttl=1)
        clock.offset = 5.0
        results = await asyncio.gather(
            *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(30))
        )
    acquired = [r for r in results if r.outcome is Outcome.ACQUIRED]
    assert len(acquired) == 1
    assert acquired[0].takeover is True
    assert acquired[0].lease is not None and acquired[0].lease.fence == first.fence + 1
    assert all(r.outcome is Outcome.IN_PROGRESS for r in results if r is not acquired[0])


async def test_concurrent_reclaims_after_release_acquire_exactly_once(
    store: DynamoDBStore,
) -> None:
    key = new_key()
    first = await acquire(store, key)
    await store.release(first)
    results = await asyncio.gather(
        *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(30))
    )
    acquired = [r for r in results if r.outcome is Outcome.ACQUIRED]
    assert len(acquired) == 1 and acquired[0].takeover is False
    assert acquired[0].lease is not None and acquired[0].lease.fence == 2


async def test_late_complete_racing_a_takeover_has_one_winner(dynamodb_store_url: str) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as store:
        for _ in range(10):
            key = new_key()
            stale = await acquire(store, key, lease_ttl=1)
            clock.offset += 5.0
            completed, taken = await asyncio.gather(
                store.complete(stale, b"late"),
                store.reserve(key, FP, lease_ttl=LONG, retention=LONG),
            )
            record = await store.get(key)
            assert record is not None
            if completed:
                # The completion landed first: the reserver must have seen it, not taken over.
                assert taken.outcome is Outcome.COMPLETED
                assert record.status is Status.COMPLETED and record.response == b"late"
            else:
                assert taken.outcome is Outcome.ACQUIRED and taken.takeover
                assert record.status is Status.IN_PROGRESS
                assert taken.lease is not None and record.token == taken.lease.token


# -- expiry and clock skew ------------------------------------------------------------------


async def complete_and_expire(store: DynamoDBStore, clock: FakeClock) -> str:
    """A key whose completed record has expired by ``clock`` (retention 10 s, now 11 s later),
    while its item is still in the table (TTL deletes it some time after)."""
    key = new_key()
    lease = await acquire(store, key)
    await store.complete(lease, b"old", retention=10)
    clock.offset = 11.0
    return key


async def test_expired_item_that_ttl_has_not_deleted_is_hidden_and_its_fence_continued(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as store:
        key = await complete_and_expire(store, clock)
        assert raw_item(dynamodb_admin, dynamodb_table, store, key) is not None
        assert await store.get(key) is None
        fresh = await store.reserve(key, "other", lease_ttl=LONG, retention=LONG)
    assert fresh.outcome is Outcome.ACQUIRED and fresh.takeover is False
    assert fresh.lease is not None and fresh.lease.fence == 2


async def test_delete_of_an_expired_item_reports_no_live_record(dynamodb_store_url: str) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as store:
        assert await store.delete(await complete_and_expire(store, clock)) is False


async def test_ttl_attribute_is_the_retention_deadline_plus_skew_in_whole_seconds(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    async with DynamoDBStore.from_url(dynamodb_store_url, clock_skew=2.5) as store:
        key = new_key()
        lease = await acquire(store, key)
        await store.complete(lease, b"x", retention=100)
        record = await store.get(key)
        item = raw_item(dynamodb_admin, dynamodb_table, store, key)
    assert record is not None
    assert int(item["ttl"]["N"]) == int(-(-(record.expires_at + 2.5) // 1))


async def test_clock_skew_margin_delays_a_takeover(dynamodb_store_url: str) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock, clock_skew=5) as store:
        key = new_key()
        await acquire(store, key, lease_ttl=1)
        clock.offset = 3.0  # past the lease, within the margin
        held = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        clock.offset = 7.0  # past lease + margin
        taken = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert held.outcome is Outcome.IN_PROGRESS
    assert taken.outcome is Outcome.ACQUIRED and taken.takeover


# -- response size --------------------------------------------------------------------------


async def test_large_compressible_response_is_stored_compressed_and_round_trips(
    store: DynamoDBStore, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    key = new_key()
    response = json.dumps([{"row": i, "name": "x" * 40} for i in range(12_000)]).encode()
    assert len(response) > 400 * 1024
    lease = await acquire(store, key)
    assert await store.complete(lease, response) is True
    item = raw_item(dynamodb_admin, dynamodb_table, store, key)
    assert item["compressed"]["BOOL"] is True
    assert len(item["response"]["B"]) < len(response) // 10
    record = await store.get(key)
    assert record is not None and record.response == response


async def test_small_response_is_stored_as_is(
    store: DynamoDBStore, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    key = new_key()
    lease = await acquire(store, key)
    await store.complete(lease, b"a" * 100)
    item = raw_item(dynamodb_admin, dynamodb_table, store, key)
    assert item["compressed"]["BOOL"] is False
    assert item["response"]["B"] == b"a" * 100


async def test_response_over_the_item_limit_raises_and_the_lease_can_still_be_released(
    store: DynamoDBStore,
) -> None:
    key = new_key()
    lease = await acquire(store, key)
    with pytest.raises(ResponseTooLargeError):
        await store.complete(lease, os.urandom(410 * 1024))
    record = await store.get(key)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert await store.release(lease) is True
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.lease is not None and again.lease.fence == lease.fence + 1


async def test_response_that_fits_alone_but_not_beside_the_checkpoints_is_refused_unwritten(
    store: DynamoDBStore,
) -> None:
    key = new_key()
    lease = await acquire(store, key)
    for step in range(MAX_CHECKPOINTS):
        await store.checkpoint(lease, f"step-{step}", os.urandom(MAX_CHECKPOINT_DATA))
    # Incompressible and under the item limit by itself; the checkpoints hold about 34 KB.
    response = os.urandom(380 * 1024)
    with pytest.raises(ResponseTooLargeError, match="and its 32 checkpoints") as refused:
        await store.complete(lease, response)
    assert refused.value.__cause__ is None  # our check, not DynamoDB's ValidationException
    record = await store.get(key)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert len(record.checkpoints) == MAX_CHECKPOINTS
    assert await store.complete(lease, response[: 300 * 1024]) is True


async def test_small_checkpoints_past_the_count_that_fits_at_their_largest_are_kept(
    dynamodb_store_url: str,
) -> None:
    # A key this long leaves room for 3 checkpoints of the largest size (moto refuses items
    # over 405,000 bytes, so the item must stay under that).
    key = "k" * (ITEM_LIMIT - 6000)
    async with DynamoDBStore.from_url(dynamodb_store_url, max_key_length=len(key)) as store:
        lease = await acquire(store, key)
        for step in range(6):
            assert await store.checkpoint(lease, f"{step}", b"") is True
        record = await store.get(key)
        assert record is not None
        assert [c.name for c in record.checkpoints] == ["0", "1", "2", "3", "4", "5"]
        assert await store.complete(lease, b"ok") is True


# -- SDK retries of writes that had landed ---------------------------------------------------


def retry_first_success(session: Any, operation: str, *, after: int = 0) -> list[int]:
    """Make the SDK resend the first successful ``operation`` (after ``after`` others) once,
    as it would after a timeout whose request had in fact been applied."""
    retried: list[int] = []
    passed = [0]

    def needs_retry(response: Any = None, **_: Any) -> int | None:
        if response is not None and response[0].status_code == 200 and not retried:
            if passed[0] < after:
                passed[0] += 1
                return None
            retried.append(1)
            return 0  # retry at once
        return None

    session.register(f"needs-retry.dynamodb.{operation}", needs_retry)
    return retried


# A fresh key is claimed with a PutItem; a key the store released goes to the UpdateItem.
@pytest.mark.parametrize("operation", ["PutItem", "UpdateItem"])
async def test_sdk_retry_of_a_landed_reserve_still_acquires(
    dynamodb_store_url: str, operation: str
) -> None:
    session, sent = counting_session()
    # (The UpdateItem case lets the release's UpdateItem through.)
    retried = retry_first_success(session, operation, after=int(operation == "UpdateItem"))
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        key = new_key()
        if operation == "UpdateItem":
            assert await store.release(await acquire(store, key)) is True
        sent.clear()
        reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert retried and sent[operation] == 2 and sum(sent.values()) == 2
        assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
        assert await store.complete(reservation.lease, b"ok") is True


async def test_sdk_retry_of_a_landed_complete_reports_success(dynamodb_store_url: str) -> None:
    async with DynamoDBStore.from_url(dynamodb_store_url) as plain:
        key = new_key()
        lease = await acquire(plain, key)
    session, sent = counting_session()
    retried = retry_first_success(session, "UpdateItem")
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        assert await store.complete(lease, b"once") is True
        assert retried and sent["UpdateItem"] == 2
        assert await store.complete(lease, b"once") is False  # a second call is refused


async def test_close_during_the_first_connect_fails_the_operation_and_keeps_no_client(
    dynamodb_endpoint: str, dynamodb_table: str
) -> None:
    direct_url = url_for(dynamodb_endpoint, dynamodb_table, "&auto_create=true")
    async with FaultProxy.for_url(direct_url) as proxy:
        # auto_create makes the first connect talk to the table (DescribeTable) before use.
        store = DynamoDBStore.from_url(proxy.route(direct_url))
        proxy.hang()
        operation = asyncio.create_task(store.get(new_key()))
        await asyncio.sleep(0.3)  # the operation waits for DescribeTable's answer
        await store.close()
        proxy.resume()
        with pytest.raises(RuntimeError, match="closed"):
            await operation
        assert store._connection is None


# -- table management (for `idemstore migrate`) ---------------------------------------------


def url_for(endpoint: str, table: str, extra: str = "") -> str:
    return f"dynamodb://{table}?region=us-east-1&endpoint_url={endpoint}{extra}"


async def test_create_table_creates_an_active_on_demand_table_with_ttl(
    dynamodb_endpoint: str, dynamodb_admin: Any
) -> None:
    table = f"idem_{uuid.uuid4().hex}"
    store = DynamoDBStore.from_url(url_for(dynamodb_endpoint, table))
    try:
        assert (await store.table_status())["exists"] is False
        assert await store.create_table() is True
        status = await store.table_status()
        assert status == {
            "table": table,
            "exists": True,
            "status": "ACTIVE",
            "key_schema_ok": True,
            "ttl_enabled": True,
            "ttl_attribute": "ttl",
            "billing_mode": "PAY_PER_REQUEST",
        }
        assert await store.create_table() is False  # already there: nothing to do
        assert (await store.reserve(new_key(), FP, lease_ttl=1, retention=1)).acquired
    finally:
        await store.close()
        dynamodb_admin.delete_table(TableName=table)


async def test_create_table_refuses_a_table_with_another_key_schema(
    dynamodb_endpoint: str, dynamodb_admin: Any
) -> None:
    table = f"idem_{uuid.uuid4().hex}"
    dynamodb_admin.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    store = DynamoDBStore.from_url(url_for(dynamodb_endpoint, table))
    try:
        assert (await store.table_status())["key_schema_ok"] is False
        with pytest.raises(SchemaError, match="another key schema"):
            await store.create_table()
        with pytest.raises(SchemaError):
            await store.get("k")
    finally:
        await store.close()
        dynamodb_admin.delete_table(TableName=table)


def test_table_definition_is_json_for_create_table_and_cloudformation() -> None:
    definition = DynamoDBStore("idem_orders").table_definition()
    assert json.loads(json.dumps(definition)) == {
        "TableName": "idem_orders",
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
        "TimeToLiveSpecification": {"AttributeName": "ttl", "Enabled": True},
    }


async def test_missing_table_raises_schema_error_naming_migrate(dynamodb_endpoint: str) -> None:
    store = open_store(url_for(dynamodb_endpoint, "idem_missing_table"))
    try:
        with pytest.raises(SchemaError, match="idemstore migrate dynamodb://idem_missing_table"):
            await store.reserve("k", FP, lease_ttl=1, retention=1)
        with pytest.raises(SchemaError):
            await store.get("k")
    finally:
        await store.close()


async def test_entering_a_store_without_its_table_fails_at_once(dynamodb_endpoint: str) -> None:
    store = open_store(url_for(dynamodb_endpoint, "idem_missing_table"))
    with pytest.raises(SchemaError):
        async with store:
            pass
    with pytest.raises(RuntimeError):
        await store.get("k")  # closed by the failed entry


async def test_auto_create_creates_the_missing_table_on_first_use(
    dynamodb_endpoint: str, dynamodb_admin: Any
) -> None:
    table = f"idem_{uuid.uuid4().hex}"
    try:
        async with open_store(url_for(dynamodb_endpoint, table, "&auto_create=true")) as store:
            assert (await store.reserve("k", FP, lease_ttl=1, retention=1)).acquired
        assert dynamodb_admin.describe_table(TableName=table)["Table"]["TableStatus"] == "ACTIVE"
    finally:
        dynamodb_admin.delete_table(TableName=table)


# -- sweep, errors, configuration -----------------------------------------------------------


async def test_sweep_deletes_expired_items_and_keeps_live_ones(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    clock = FakeClock.ticking()
    async with DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as store:
        doomed = [new_key() for _ in range(5)]
        for key in doomed:
            lease = await acquire(store, key)
            await store.complete(lease, b"x", retention=10)
        kept = await acquire(store, new_key())
        clock.offset = 11.0
        assert await store.sweep(limit=3) == 3
        assert await store.sweep(limit=100) == 2
        assert await store.sweep(limit=100) == 0
        assert await store.get(kept.key) is not None
    assert dynamodb_admin.scan(TableName=dynamodb_table, Select="COUNT")["Count"] == 1


def fail_first_delete_and_slow_the_others(session: Any) -> None:
    """The first ``DeleteItem`` fails at once (a reset connection, which the SDK does not
    retry when raised here); the others leave 0.3 s later."""
    seen: list[int] = []

    async def before_send(**_: Any) -> None:
        seen.append(1)
        if len(seen) == 1:
            raise ConnectionResetError("reset by the test")
        await asyncio.sleep(0.3)

    session.register("before-send.dynamodb.DeleteItem", before_send)


async def test_sweep_with_a_failing_delete_finishes_the_others_then_raises(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    from aiobotocore.session import AioSession

    clock = FakeClock.ticking()
    session = AioSession()
    fail_first_delete_and_slow_the_others(session)
    url = dynamodb_store_url + "&max_attempts=1"
    async with DynamoDBStore.from_url(url, clock=clock, session=session) as store:
        for _ in range(5):
            lease = await acquire(store, new_key())
            await store.complete(lease, b"x", retention=10)
        clock.offset = 11.0
        with pytest.raises(StoreUnavailableError) as caught:
            await store.sweep(limit=100)
        # Raised only once every other delete had landed.
        assert dynamodb_admin.scan(TableName=dynamodb_table, Select="COUNT")["Count"] == 1
        assert "removed 4" in "".join(caught.value.__notes__)


@pytest.mark.parametrize("limit", [0, -1, True, 2.5, "5", None])
async def test_sweep_rejects_a_limit_that_is_not_a_positive_int(
    store: DynamoDBStore, limit: Any
) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        await store.sweep(limit=limit)


@pytest.mark.parametrize("timeout", [float("nan"), -1, -0.5, True, "1", None])
async def test_wait_rejects_a_timeout_that_is_not_a_non_negative_number(
    store: DynamoDBStore, timeout: Any
) -> None:
    key = new_key()
    await acquire(store, key)
    with pytest.raises(ConfigurationError, match="timeout"):
        await store.wait(key, timeout=timeout)


async def test_wait_with_a_zero_timeout_returns_the_current_record(store: DynamoDBStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    record = await store.wait(key, timeout=0)
    assert record is not None and record.token == lease.token


async def test_unreachable_endpoint_raises_store_unavailable() -> None:
    url = url_for(f"http://127.0.0.1:{free_port()}", "idem_nowhere", "&max_attempts=1")
    store = open_store(url + "&connect_timeout=0.5&read_timeout=0.5")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.get("k")
        assert caught.value.__cause__ is not None
    finally:
        await store.close()


def test_throttling_after_retries_maps_to_store_unavailable() -> None:
    from botocore.exceptions import ClientError

    throttled = ClientError(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
        "UpdateItem",
    )
    error = DynamoDBStore("idem_t")._errors.translate(throttled)
    assert isinstance(error, StoreUnavailableError)
    assert "throttling" in str(error)


async def test_close_is_idempotent_and_final(store: DynamoDBStore) -> None:
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError):
        await store.get("k")
