"""A completion of a lease the store acquired itself is one conditional ``PutItem`` of the
whole record (``idemstore.backends.dynamodb.whole_completions``): it must refuse and leave the
item alone wherever the update would, recognise its own SDK retry, keep the item limit, and
hand every case it cannot decide to the update."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Outcome, ResponseTooLargeError, Status
from idemstore.backends.dynamodb import DynamoDBStore
from idemstore.testing import FakeClock
from tests.backends.test_dynamodb import (
    FP,
    LONG,
    acquire,
    counting_session,
    new_key,
    raw_item,
    retry_first_success,
)

if TYPE_CHECKING:
    from collections import Counter

    from idemstore import Lease


def counted_store(url: str, **options: Any) -> tuple[DynamoDBStore, Counter[str]]:
    session, sent = counting_session()
    return DynamoDBStore.from_url(url, session=session, **options), sent


async def test_a_lease_the_store_acquired_completes_with_one_put_of_the_whole_record(
    dynamodb_store_url: str,
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        lease = await acquire(store, key)
        held = await store.get(key)
        sent.clear()
        assert await store.complete(lease, b"done") is True
        assert dict(sent) == {"PutItem": 1}
        record = await store.get(key)
        assert held is not None and record is not None
        assert record.status is Status.COMPLETED and record.response == b"done"
        assert (record.fingerprint, record.created_at, record.token, record.fence) == (
            held.fingerprint,
            held.created_at,
            held.token,
            held.fence,
        )
        assert record.lease_expires_at is None
        replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert replay.outcome is Outcome.COMPLETED and replay.record is not None
        assert replay.record.response == b"done"
        assert await store.complete(lease, b"again") is False  # never rewritten


async def test_a_lease_another_store_acquired_completes_with_the_update(
    dynamodb_store_url: str,
) -> None:
    async with DynamoDBStore.from_url(dynamodb_store_url) as other:
        lease = await acquire(other, new_key())
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        sent.clear()  # (entering pings)
        assert await store.complete(lease, b"done") is True
        assert dict(sent) == {"UpdateItem": 1}


async def test_a_holder_fenced_out_by_another_process_writes_nothing(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    clock = FakeClock.ticking()
    store, sent = counted_store(dynamodb_store_url, clock=clock)
    async with store, DynamoDBStore.from_url(dynamodb_store_url, clock=clock) as other:
        key = new_key()
        stale = await acquire(store, key, lease_ttl=1)
        clock.offset += 5.0
        taken = await other.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert taken.takeover and taken.lease is not None
        before = raw_item(dynamodb_admin, dynamodb_table, store, key)
        sent.clear()
        assert await store.complete(stale, b"late") is False
        assert sent["PutItem"] == 1 and "UpdateItem" not in sent
        assert raw_item(dynamodb_admin, dynamodb_table, store, key) == before
        assert await other.complete(taken.lease, b"theirs") is True


async def test_a_lease_released_elsewhere_is_not_revived(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store, DynamoDBStore.from_url(dynamodb_store_url) as other:
        key = new_key()
        lease = await acquire(store, key)
        assert await other.release(lease) is True  # the same lease, from another process
        before = raw_item(dynamodb_admin, dynamodb_table, store, key)
        sent.clear()
        assert await store.complete(lease, b"late") is False
        assert sent["PutItem"] == 1 and "UpdateItem" not in sent
        assert raw_item(dynamodb_admin, dynamodb_table, store, key) == before
        assert await store.get(key) is None


async def test_a_record_past_retention_is_not_resurrected(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    clock = FakeClock.ticking()
    store, sent = counted_store(dynamodb_store_url, clock=clock)
    async with store:
        key = new_key()
        reservation = await store.reserve(key, FP, lease_ttl=1, retention=10)
        assert reservation.lease is not None
        clock.offset += 60.0  # nobody reserved it again; its item is still in the table
        before = raw_item(dynamodb_admin, dynamodb_table, store, key)
        sent.clear()
        assert await store.complete(reservation.lease, b"late") is False
        assert sent["PutItem"] == 1 and "UpdateItem" not in sent
        assert raw_item(dynamodb_admin, dynamodb_table, store, key) == before


async def test_a_forged_fence_goes_to_the_update_and_is_refused(dynamodb_store_url: str) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        lease = await acquire(store, key)
        forged = type(lease)(lease.scope, lease.key, lease.token, lease.fence + 1, 0.0, LONG)
        sent.clear()
        assert await store.complete(forged, b"forged") is False
        assert "PutItem" not in sent
        # The genuine lease is still remembered and completes with the put.
        sent.clear()
        assert await store.complete(lease, b"ok") is True
        assert dict(sent) == {"PutItem": 1}


async def test_checkpoints_written_elsewhere_are_kept_by_the_update(
    dynamodb_store_url: str,
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store, DynamoDBStore.from_url(dynamodb_store_url) as other:
        key = new_key()
        lease = await acquire(store, key)
        assert await other.checkpoint(lease, "charged", b"42") is True
        sent.clear()
        assert await store.complete(lease, b"ok") is True
        assert sent["PutItem"] == 1 and sent["UpdateItem"] == 1  # refused, then the update
        record = await store.get(key)
        assert record is not None and record.status is Status.COMPLETED
        assert [(c.name, c.data) for c in record.checkpoints] == [("charged", b"42")]


async def test_a_checkpoint_from_this_store_sends_the_completion_to_the_update(
    dynamodb_store_url: str,
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        lease = await acquire(store, key)
        assert await store.checkpoint(lease, "charged", b"42") is True
        sent.clear()
        assert await store.complete(lease, b"ok") is True
        assert dict(sent) == {"UpdateItem": 1}
        record = await store.get(key)
        assert record is not None and len(record.checkpoints) == 1


async def test_sdk_retry_of_a_landed_put_completion_reports_success(
    dynamodb_store_url: str,
) -> None:
    session, sent = counting_session()
    retried = retry_first_success(session, "PutItem", after=1)  # the first claim passes
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        key = new_key()
        lease = await acquire(store, key)
        sent.clear()
        assert await store.complete(lease, b"once") is True
        assert retried and sent["PutItem"] == 2 and "UpdateItem" not in sent
        record = await store.get(key)
        assert record is not None and record.response == b"once"
        assert await store.complete(lease, b"once") is False


async def test_a_response_over_the_item_limit_is_refused_before_any_request(
    dynamodb_store_url: str,
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        lease = await acquire(store, key)
        sent.clear()
        with pytest.raises(ResponseTooLargeError):
            await store.complete(lease, os.urandom(410 * 1024))
        assert not sent
        record = await store.get(key)
        assert record is not None and record.status is Status.IN_PROGRESS
        # Refused by the put's check: the update's own check refuses it as before.
        with pytest.raises(ResponseTooLargeError):
            await store.complete(lease, os.urandom(410 * 1024))
        assert await store.release(lease) is True


async def test_a_role_without_put_item_completes_through_the_update(
    dynamodb_store_url: str,
) -> None:
    session, sent = counting_session()
    denied_calls: list[int] = []

    def denied(**_: Any) -> tuple[Any, dict[str, Any]]:
        denied_calls.append(1)
        error = {"Code": "AccessDeniedException", "Message": "not authorized: PutItem"}
        return SimpleNamespace(status_code=400), {"Error": error, "ResponseMetadata": {}}

    session.register("before-call.dynamodb.PutItem", denied)
    async with DynamoDBStore.from_url(dynamodb_store_url, session=session) as store:
        leases: list[Lease] = [await acquire(store, new_key()) for _ in range(2)]
        assert len(denied_calls) == 1  # the first claim asked once
        for lease in leases:
            assert await store.complete(lease, b"ok") is True
            record = await store.get(lease.key)
            assert record is not None and record.response == b"ok"
    assert len(denied_calls) == 2  # the completion asked once, then no more
    assert sent["UpdateItem"] == 4
