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

from tests.gateway.conftest import gateway_url
from tests.gateway.rpc import BOTH, CALLER, PROTOCOL, call, post

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests.gateway.processes import Child, Upstream

ONE_MODE = pytest.mark.parametrize("upstream", ["stateless"], indirect=True)
HEADERS = {**CALLER, "accept": BOTH, "mcp-protocol-version": PROTOCOL}


@contextlib.asynccontextmanager
async def _open_call(
    client: httpx.AsyncClient, url: str, message: dict[str, Any]
) -> AsyncIterator[None]:
    """A call whose answer stream stays open for the block (read in the background)."""

    async def read() -> None:
        async with client.stream("POST", url, json=message, headers=HEADERS) as response:
            async for _ in response.aiter_raw():
                pass

    reading = asyncio.create_task(read())
    try:
        yield
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await reading


async def _cancel(client: httpx.AsyncClient, url: str, request_id: object) -> None:
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "the user gave up"},
    }
    answer = await post(client, url, note)
    assert answer.status == 202


@ONE_MODE
async def test_a_cancelled_call_releases_its_derived_key_at_once(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url))
    async with (
        httpx.AsyncClient(timeout=30) as client,
        _open_call(client, url, call(1, "silent", {"n": 1})),
    ):
        await upstream.until_executed("silent")
        await _cancel(client, url, 1)
        # The retry is forwarded, not left waiting for a call nobody will answer.
        async with _open_call(client, url, call(2, "silent", {"n": 1})):
            await upstream.until_executed("silent", 2)


@ONE_MODE
async def test_a_cancelled_call_keeps_its_sep_key_only_for_the_cancel_grace(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--cancel-grace", "1"))
    message = call(1, "silent", {"n": 1}, idempotencyKey="k")
    async with httpx.AsyncClient(timeout=30) as client, _open_call(client, url, message):
        await upstream.until_executed("silent")
        await _cancel(client, url, 1)
        held = await post(client, url, {**message, "id": 2})
        assert held.final()["error"]["data"]["type"] == "idempotency_key_in_progress"
        await asyncio.sleep(1.5)
        async with _open_call(client, url, {**message, "id": 3}):
            await upstream.until_executed("silent", 2)


@ONE_MODE
async def test_a_cancel_from_another_caller_changes_nothing(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--cancel-grace", "1"))
    message = call(1, "silent", {"n": 1}, idempotencyKey="k")
    async with httpx.AsyncClient(timeout=30) as client, _open_call(client, url, message):
        await upstream.until_executed("silent")
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
        note["params"] = {"requestId": 1}
        await post(client, url, note, headers={"authorization": "Bearer mallory"})
        await asyncio.sleep(1.5)
        held = await post(client, url, {**message, "id": 2})
        assert held.final()["error"]["data"]["type"] == "idempotency_key_in_progress"
    assert upstream.executions("silent") == ["silent"]
