"""SEP-2243 in the server adapters: a keyed ``tools/call`` whose ``Mcp-Method`` or ``Mcp-Name``
contradicts its body is refused (``-32020``), also on a 2025-era request the SDK does not check."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from idemstore.backends.memory import MemoryStore
from tests.mcp_server.servers import Tools, build

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2025-11-25",
    "host": "127.0.0.1:8000",
}


@asynccontextmanager
async def serving(adapter: str) -> AsyncIterator[tuple[httpx.AsyncClient, Tools]]:
    # Entered and exited in the test's own task: the app's lifespan holds a task group.
    tools = Tools()
    app = build(adapter, tools, MemoryStore()).streamable_http_app(
        stateless_http=True, json_response=True
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client,
    ):
        yield client, tools


def _keyed_call(n: int) -> dict[str, Any]:
    params = {"name": "charge", "arguments": {"amount": 1}, "idempotencyKey": f"k-{n}"}
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}


@pytest.mark.parametrize(
    "routing", [{"mcp-method": "tools/list"}, {"mcp-method": "tools/call", "mcp-name": "slow"}]
)
async def test_a_keyed_call_whose_headers_disagree_with_its_body_is_refused(
    adapter: str, routing: dict[str, str]
) -> None:
    async with serving(adapter) as (client, tools):
        response = await client.post("/mcp", json=_keyed_call(1), headers={**HEADERS, **routing})
    assert response.json()["error"]["code"] == -32020
    assert tools.count("charge") == 0


async def test_a_keyed_call_whose_headers_agree_runs(adapter: str) -> None:
    routing = {"mcp-method": "tools/call", "mcp-name": "charge"}
    async with serving(adapter) as (client, tools):
        response = await client.post("/mcp", json=_keyed_call(2), headers={**HEADERS, **routing})
    assert "result" in response.json()
    assert tools.count("charge") == 1
