"""Refusals of the execution path through the real ``mcp`` client: the same table as the proxy's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import pytest

from idemstore import open_store
from idemstore.backends.memory import MemoryStore
from idemstore.execution.refusals import Refusal
from idemstore.mcp import sep3182
from idemstore.mcp.refusal_errors import REFUSAL_ERRORS, refusal_error
from idemstore.testing import FakeClock
from tests.mcp_server.conftest import call, connect, error_of
from tests.mcp_server.servers import Tools, build

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize("refusal", list(Refusal))
def test_a_refusal_no_retry_can_fix_never_says_store_unavailable(refusal: Refusal) -> None:
    error = refusal_error(refusal, "k", "why")
    assert (error["code"], error["data"]["type"]) == REFUSAL_ERRORS[refusal]
    assert error["data"][sep3182.KEY_FIELD] == "k"
    if not refusal.retryable:
        assert error["data"]["type"] != sep3182.STORE_UNAVAILABLE


async def test_a_key_over_the_stores_own_limit_is_invalid_params(adapter: str, era: str) -> None:
    tools = Tools()
    # The adapters accept keys of up to 255 characters; this store only 8.
    store = open_store("memory://?max_key_length=8")
    async with connect(build(adapter, tools, store), era) as client:
        error = error_of(await call(client, "charge", {"amount": 5}, key="123456789"))
    assert error["code"] == types.INVALID_PARAMS
    assert error["data"] == {"type": sep3182.INVALID_KEY, "idempotencyKey": "123456789"}
    assert "limit is 8" in error["message"]
    assert tools.count("charge") == 0


async def test_an_unmigrated_database_names_idemstore_migrate_not_store_unavailable(
    adapter: str, era: str, tmp_path: Path
) -> None:
    tools = Tools()
    store = open_store(f"sqlite:///{tmp_path / 'secret-name.db'}?auto_migrate=false")
    try:
        async with connect(build(adapter, tools, store), era) as client:
            error = error_of(await call(client, "charge", {"amount": 5}, key="k-schema"))
    finally:
        await store.close()
    assert error["code"] == types.INTERNAL_ERROR
    assert error["data"]["type"] == sep3182.SCHEMA_MISSING
    assert "idemstore migrate" in error["message"]
    assert "secret-name" not in str(error)
    assert tools.count("charge") == 0


async def test_a_takeover_refused_is_outcome_unknown_for_every_retry(
    adapter: str, era: str
) -> None:
    clock = FakeClock(1_000_000.0)
    tools = Tools()
    server = build(adapter, tools, MemoryStore(clock=clock), on_takeover="refuse")
    answers: list[Any] = []
    async with connect(server, era) as client:

        async def original() -> None:
            answers.append(await call(client, "slow", {"amount": 1}, key="k-taken"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(original)
            with anyio.fail_after(10):
                await tools.started.wait()
            # The original's lease lapses (as if its process died): the retry takes it over.
            clock.advance(31)
            retry = error_of(await call(client, "slow", {"amount": 1}, key="k-taken"))
            tools.gate.set()
        again = error_of(await call(client, "slow", {"amount": 1}, key="k-taken"))
    for error in (retry, again):
        assert error["code"] == types.INVALID_REQUEST
        assert error["data"] == {"type": sep3182.OUTCOME_UNKNOWN, "idempotencyKey": "k-taken"}
    assert isinstance(answers[0], dict)  # the original's caller still gets its result
    assert tools.count("slow") == 1


async def test_an_outcome_over_max_response_bytes_is_refused_to_every_retry(
    adapter: str, era: str
) -> None:
    # One rule in every door: the tool ran, its outcome cannot be recorded, so the key keeps
    # the "outcome not recorded" marker; a released key would let a retry run it again.
    tools = Tools()
    server = build(adapter, tools, MemoryStore(), max_response_bytes=20)
    async with connect(server, era) as client:
        first = await call(client, "charge", {"amount": 5}, key="k-big")
        retries = [error_of(await call(client, "charge", {"amount": 5}, key="k-big"))]
        retries.append(error_of(await call(client, "charge", {"amount": 5}, key="k-big")))
    assert isinstance(first, dict)  # the original's caller gets its result
    for error in retries:
        assert error["code"] == types.INVALID_REQUEST
        data = error["data"]
        assert data["type"] == sep3182.OUTCOME_UNRECORDED
        assert data["idempotencyKey"] == "k-big"
        assert data["limit"] == 20 and data["size"] > 20
    assert tools.count("charge") == 1
