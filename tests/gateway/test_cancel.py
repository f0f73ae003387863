"""A client's ``notifications/cancelled`` through the gateway: the stdio proxy's rule.

The upstream's ``silent`` tool never answers and keeps its stream open, as MCP recommends for a
cancelled request: the key must not stay held for as long as that stream does.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.gateway.conftest import ONE_MODE, gateway_url
from tests.gateway.rpc import BOTH, CALLER, PROTOCOL, call, post

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests.gateway.processes import Child, Upstream

pytestmark = ONE_MODE
HEADERS = {**CALLER, "accept": BOTH, "mcp-protocol-version": PROTOCOL}
SEP_CALL = call(1, "silent", {"n": 1}, idempotencyKey="k")


@pytest.fixture
def graced(upstream: Upstream, gateways: Callable[..., Child]) -> str:
    """A gateway that holds a cancelled call's SEP key for a one-second grace."""
    return gateway_url(gateways(upstream.url, "memory://", "--cancel-grace", "1"))


@contextlib.asynccontextmanager
async def _running(
    client: httpx.AsyncClient, url: str, message: dict[str, Any], upstream: Upstream
) -> AsyncIterator[None]:
    """A call the upstream is running, its answer stream open for the block (read in the
    background)."""
    tool = message["params"]["name"]
    runs = len(upstream.executions(tool)) + 1

    async def read() -> None:
        async with client.stream("POST", url, json=message, headers=HEADERS) as response:
            async for _ in response.aiter_raw():
                pass

    reading = asyncio.create_task(read())
    try:
        await upstream.until_executed(tool, runs)
        yield
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await reading


async def _cancel(
    client: httpx.AsyncClient, url: str, request_id: object, headers: dict[str, str] | None = None
) -> None:
    """Cancel ``request_id``, as the default caller unless ``headers`` name another."""
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "the user gave up"},
    }
    answer = await post(client, url, note, headers=headers)
    assert answer.status == 202


async def _assert_held(client: httpx.AsyncClient, url: str, retry: dict[str, Any]) -> None:
    """The key of ``retry`` is still held: the gateway answers that it is in progress (to a
    retry that takes JSON only: one that takes a stream would follow the original's)."""
    held = await post(client, url, retry, accept="application/json")
    assert held.final()["error"]["data"]["type"] == "idempotency_key_in_progress"


async def test_a_cancelled_call_releases_its_derived_key_at_once(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    async with _running(client, gateway, call(1, "silent", {"n": 1}), upstream):
        await _cancel(client, gateway, 1)
        # The retry is forwarded, not left waiting for a call nobody will answer.
        async with _running(client, gateway, call(2, "silent", {"n": 1}), upstream):
            assert upstream.executions("silent") == ["silent"] * 2


async def test_a_cancelled_call_keeps_its_sep_key_only_for_the_cancel_grace(
    upstream: Upstream, graced: str, client: httpx.AsyncClient
) -> None:
    async with _running(client, graced, SEP_CALL, upstream):
        await _cancel(client, graced, 1)
        await _assert_held(client, graced, {**SEP_CALL, "id": 2})
        await asyncio.sleep(1.5)
        async with _running(client, graced, {**SEP_CALL, "id": 3}, upstream):
            assert upstream.executions("silent") == ["silent"] * 2


async def test_a_cancel_from_another_caller_changes_nothing(
    upstream: Upstream, graced: str, client: httpx.AsyncClient
) -> None:
    async with _running(client, graced, SEP_CALL, upstream):
        await _cancel(client, graced, 1, headers={"authorization": "Bearer mallory"})
        await asyncio.sleep(1.5)
        await _assert_held(client, graced, {**SEP_CALL, "id": 2})
    assert upstream.executions("silent") == ["silent"]
