"""Every refusal of the execution path answered from one table, through httpx on both apps."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import open_store
from idemstore.backends.memory import MemoryStore
from idemstore.errors import ResponseTooLargeError, StoreUnavailableError
from idemstore.execution.refusals import Refusal
from idemstore.problems import REFUSAL_PROBLEMS, problem_type, refusal_problem
from idemstore.testing import FakeClock
from tests.http.apps import create_app
from tests.http.conftest import calls, client_of, keyed, post_twice

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import httpx

    from idemstore.protocol import IdempotencyStore, Lease


def refused(response: httpx.Response, refusal: Refusal) -> dict[str, Any]:
    """The problem document of ``response``, checked to be ``refusal``'s answer."""
    answer = REFUSAL_PROBLEMS[refusal]
    assert response.status_code == answer.status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    document: dict[str, Any] = response.json()
    assert document["type"] == problem_type(refusal)
    assert document["status"] == answer.status
    assert ("retry-after" in response.headers) is refusal.retryable
    return document


@pytest.mark.parametrize("refusal", list(Refusal))
def test_a_refusal_no_retry_can_fix_is_never_a_503_nor_says_retry_after(refusal: Refusal) -> None:
    status, headers, _ = refusal_problem(refusal, key="k")
    if not refusal.retryable:
        assert status != 503
        assert b"retry-after" not in dict(headers)
    else:
        assert dict(headers)[b"retry-after"] == b"1"


async def test_a_key_over_the_stores_own_limit_is_400_not_503(framework: str) -> None:
    # The middleware accepts keys of up to 255 characters; this store only 8.
    async with open_store("memory://?max_key_length=8") as store:
        app = create_app(framework, store)
        async with client_of(app) as client:
            response = await client.post("/orders", json={}, headers=keyed("123456789"))
    document = refused(response, Refusal.INVALID_KEY)
    assert "limit is 8" in document["detail"]
    assert calls(app, "create_order") == 0


async def test_an_unmigrated_database_is_500_naming_idemstore_migrate_not_503(
    framework: str, tmp_path: Path
) -> None:
    secret_path = str(tmp_path / "secret-name.db")
    # Not ``async with``: entering would connect, and fail, before any request.
    store = open_store(f"sqlite:///{secret_path}?auto_migrate=false")
    try:
        app = create_app(framework, store)
        async with client_of(app) as client:
            response = await client.post("/orders", json={}, headers=keyed("k-schema"))
    finally:
        await store.close()
    document = refused(response, Refusal.SCHEMA_MISSING)
    assert "idemstore migrate" in document["detail"]
    assert "secret-name" not in response.text
    assert calls(app, "create_order") == 0


async def test_a_takeover_refused_is_outcome_unknown_for_every_retry_never_503(
    framework: str,
) -> None:
    clock = FakeClock(1_000_000.0)
    app = create_app(framework, MemoryStore(clock=clock), on_takeover="refuse")
    async with client_of(app) as client:
        original = asyncio.create_task(client.post("/slow", headers=keyed("k-taken")))
        await asyncio.wait_for(app.state.started.wait(), 10)
        # The original's lease lapses (as if its process died): the retry takes the key over.
        clock.advance(31)
        retry = await client.post("/slow", headers=keyed("k-taken"))
        document = refused(retry, Refusal.OUTCOME_UNKNOWN)
        assert document["idempotencyKey"] == "k-taken"
        app.state.gate.set()
        assert (await original).status_code == 200  # its own client still gets its answer
        refused(await client.post("/slow", headers=keyed("k-taken")), Refusal.OUTCOME_UNKNOWN)
    assert calls(app, "slow") == 1


class _SmallItems(MemoryStore):
    """A memory store whose items hold at most 1000 bytes, as DynamoDB's hold 400 KB."""

    async def complete(self, lease: Lease, response: bytes, *, retention: Any = None) -> bool:
        if len(response) > 1000:
            raise ResponseTooLargeError("item too large", size=len(response), limit=1000)
        return await super().complete(lease, response, retention=retention)


async def test_a_response_too_large_for_the_store_is_not_run_again_and_never_503(
    framework: str,
) -> None:
    app = create_app(framework, _SmallItems())
    async with client_of(app) as client:
        first, again = await post_twice(client, "/big?size=5000", "k-big")
    assert first.status_code == 200 and len(first.content) > 5000
    refused(again, Refusal.OUTCOME_UNRECORDED)
    assert calls(app, "big") == 1


class _SlowReserve(MemoryStore):
    """A store whose reply to ``reserve`` comes after the lease it grants has lapsed."""

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        reservation = await super().reserve(*args, **kwargs)
        await asyncio.sleep(0.2)
        return reservation


async def test_a_lease_lost_before_the_request_ran_is_503_with_retry_after(framework: str) -> None:
    app = create_app(framework, _SlowReserve(), lease_ttl=0.1)
    async with client_of(app) as client:
        response = await client.post("/orders", json={}, headers=keyed("k-late"))
    refused(response, Refusal.LEASE_LOST)
    assert calls(app, "create_order") == 0


@pytest.fixture
async def down_store() -> AsyncIterator[IdempotencyStore]:
    class DownStore(MemoryStore):
        async def reserve(self, *args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("engine down at postgresql://app:hunter2@db/app")

    async with DownStore() as store:
        yield store


async def test_an_unreachable_store_answers_from_the_table_without_its_message(
    framework: str, down_store: IdempotencyStore
) -> None:
    app = create_app(framework, down_store)
    async with client_of(app) as client:
        response = await client.post("/orders", json={}, headers=keyed("k-down"))
    refused(response, Refusal.STORE_UNAVAILABLE)
    assert "hunter2" not in response.text
