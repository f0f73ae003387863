"""Listing a store's live records (``ListingStore.records``, ``idemstore keys``), on every
store that offers it: every built-in one does."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, cast

import pytest

from idemstore.protocol import ListingStore, offers
from idemstore.testing.contract.test_store_contract import FP, LONG, SHORT, SLACK, new_key

if TYPE_CHECKING:
    from idemstore import IdempotencyStore


@pytest.fixture
def listing(store: IdempotencyStore) -> ListingStore:
    if not offers(store, ListingStore):
        pytest.skip("this store cannot list its records (an optional capability)")
    return cast("ListingStore", store)


async def keys_of(listing: ListingStore, **filters: object) -> set[str]:
    return {record.key async for record in listing.records(**filters)}  # type: ignore[arg-type]


async def test_records_lists_live_records_by_scope_state_and_age(listing: ListingStore) -> None:
    store = cast("IdempotencyStore", listing)
    scope = f"scope-{uuid.uuid4().hex}"
    held = {}
    for name, lease_ttl in (("running", LONG), ("stuck", SHORT), ("done", LONG), ("gone", LONG)):
        reserved = await store.reserve(
            new_key(), FP, scope=scope, lease_ttl=lease_ttl, retention=LONG
        )
        assert reserved.lease is not None
        held[name] = reserved.lease
    assert await store.complete(held["done"], b"ok") is True
    assert await store.release(held["gone"]) is True
    await store.reserve(new_key(), FP, scope=scope + "-other", lease_ttl=LONG, retention=LONG)
    await asyncio.sleep(SHORT + SLACK)

    live = {held[name].key for name in ("running", "stuck", "done")}
    assert await keys_of(listing, scope=scope) == live
    assert await keys_of(listing, scope=scope, state="in_progress") == {held["running"].key}
    assert await keys_of(listing, scope=scope, state="stuck") == {held["stuck"].key}
    assert await keys_of(listing, scope=scope, state="completed") == {held["done"].key}
    assert await keys_of(listing, scope=scope, older_than=3600) == set()
    assert len(await keys_of(listing, scope=scope, limit=2)) == 2
    completed = [record async for record in listing.records(scope=scope, state="completed")]
    assert [(r.scope, r.response, r.fence) for r in completed] == [(scope, b"ok", 1)]
