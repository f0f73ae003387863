"""The gateway's outcome rule: a result the store cannot record leaves the "outcome not
recorded" marker, and every retry is refused with the size and the limit (the shared map)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from idemstore.mcp.gateway import GatewayConfig, McpGateway
from tests.gateway.conftest import ONE_MODE
from tests.gateway.rpc import call, post
from tests.memory_store import SmallItemStore

if TYPE_CHECKING:
    from tests.gateway.processes import Upstream


@ONE_MODE
async def test_a_result_too_large_for_the_store_is_refused_to_every_retry(
    upstream: Upstream,
) -> None:
    gateway = McpGateway(SmallItemStore(), GatewayConfig(upstream=upstream.url))
    async with (
        gateway.connected(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as client,
    ):
        url = "http://gateway/mcp"
        first = await post(client, url, call(1, "record", {"n": 1, "note": "x" * 80}))
        assert "result" in first.final()
        for n in (2, 3):
            retry = await post(client, url, call(n, "record", {"n": 1, "note": "x" * 80}))
            error = retry.final()["error"]
            assert error["code"] == -32600
            assert error["data"]["type"] == "idempotency_outcome_unrecorded"
            assert error["data"]["limit"] == SmallItemStore.LIMIT
            assert error["data"]["size"] > SmallItemStore.LIMIT
    assert upstream.executions() == ["record"]
