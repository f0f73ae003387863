"""A key the store completed itself is read before anything is written: the retry that comes
back to the process that ran it is one ``GetItem`` (one read unit per 4 KB, where a refused
write is one write unit per KB), and a record that went meanwhile is decided by the update."""

from __future__ import annotations

from typing import Any

from idemstore import Outcome
from idemstore.backends.dynamodb import DynamoDBStore
from idemstore.testing import FakeClock
from tests.backends.test_dynamodb import FP, LONG, acquire, new_key
from tests.backends.test_dynamodb_whole_completions import counted_store


async def test_a_retry_of_a_key_completed_here_is_one_read(dynamodb_store_url: str) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        assert await store.complete(await acquire(store, key), b"done") is True
        sent.clear()
        replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert dict(sent) == {"GetItem": 1}
        assert replay.outcome is Outcome.COMPLETED and replay.record is not None
        assert replay.record.response == b"done"
        sent.clear()
        other = await store.reserve(key, "other arguments", lease_ttl=LONG, retention=LONG)
        assert dict(sent) == {"GetItem": 1}
        assert other.outcome is Outcome.MISMATCH


async def test_a_record_deleted_elsewhere_is_acquired_afresh(
    dynamodb_store_url: str, dynamodb_admin: Any, dynamodb_table: str
) -> None:
    from idemstore.backends.dynamodb.items import partition_key

    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        assert await store.complete(await acquire(store, key), b"done") is True
        dynamodb_admin.delete_item(TableName=dynamodb_table, Key=partition_key("", key))
        sent.clear()
        again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert again.outcome is Outcome.ACQUIRED
        assert sent["GetItem"] == 1
        assert again.lease is not None
        assert await store.complete(again.lease, b"second") is True
        record = await store.get(key)
        assert record is not None and record.response == b"second"


async def test_a_record_past_its_retention_is_acquired_afresh(dynamodb_store_url: str) -> None:
    clock = FakeClock.ticking()
    store, _ = counted_store(dynamodb_store_url, clock=clock)
    async with store:
        key = new_key()
        lease = await acquire(store, key)
        assert await store.complete(lease, b"done", retention=5.0) is True
        clock.offset = 10.0
        again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert again.outcome is Outcome.ACQUIRED and again.lease is not None
        assert again.lease.fence > lease.fence


async def test_a_retry_of_a_key_completed_by_another_process_is_not_read_first(
    dynamodb_store_url: str,
) -> None:
    async with DynamoDBStore.from_url(dynamodb_store_url) as other:
        key = new_key()
        assert await other.complete(await acquire(other, key), b"done") is True
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        sent.clear()
        replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
        assert replay.outcome is Outcome.COMPLETED
        assert sent["PutItem"] == 1  # the first claim, as for any key it did not complete


async def test_a_key_completed_here_for_one_caller_is_not_read_back_to_another(
    dynamodb_store_url: str,
) -> None:
    store, sent = counted_store(dynamodb_store_url)
    async with store:
        key = new_key()
        mine = await store.reserve(key, FP, scope="alice", lease_ttl=LONG, retention=LONG)
        assert mine.lease is not None
        assert await store.complete(mine.lease, b"alice's receipt") is True
        sent.clear()
        theirs = await store.reserve(key, FP, scope="mallory", lease_ttl=LONG, retention=LONG)
        assert theirs.outcome is Outcome.ACQUIRED and theirs.record is None
        assert "GetItem" not in sent  # no read of alice's key on mallory's behalf
        again = await store.reserve(key, FP, scope="alice", lease_ttl=LONG, retention=LONG)
        assert again.outcome is Outcome.COMPLETED and again.record is not None
        assert again.record.response == b"alice's receipt"
