"""Everything but tools/call crosses the gateway unchanged, and the official client works."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
from mcp import Client

from tests.gateway.conftest import gateway_url
from tests.gateway.processes import free_port
from tests.gateway.rpc import BOTH, open_session, open_session_id, post

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.gateway.processes import Child, Upstream


@pytest.mark.parametrize("client_mode", ["legacy", "auto"])
async def test_official_client_works_through_the_gateway_unchanged(
    upstream: Upstream, gateway: str, client_mode: str
) -> None:
    async with Client(gateway, mode=client_mode) as client:
        expected = "2025-11-25" if client_mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names == ["record", "slow", "progress", "look", "whoami", "charge", "headers"]
        result = await client.call_tool("record", {"n": 7, "note": "via gateway"})
        assert result.content[0].text == "recorded 7 via gateway"
        progress = await client.call_tool("progress", {"n": 1})
        assert progress.content[0].text == "progress 1 done"
    assert upstream.executions() == ["record", "progress"]


async def test_initialize_answer_declares_the_idempotency_capability(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    direct = await open_session(client, upstream.url)
    through = await open_session(client, gateway)
    assert through.status == direct.status == 200
    assert through.media == direct.media  # JSON stays JSON, a stream stays a stream
    (theirs,) = direct.messages()
    (ours,) = through.messages()
    assert "idempotency" not in theirs["result"]["capabilities"]["tools"]
    assert ours["result"]["capabilities"]["tools"]["idempotency"] == {}
    del ours["result"]["capabilities"]["tools"]["idempotency"]
    assert ours["result"] == theirs["result"]


async def test_server_discover_answer_declares_the_idempotency_capability(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    version = "2026-07-28"
    discover = {
        "jsonrpc": "2.0",
        "id": "d",
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    headers = {"mcp-method": "server/discover", "mcp-protocol-version": version}
    direct = await post(client, upstream.url, discover, headers=headers)
    through = await post(client, gateway, discover, headers=headers)
    assert through.status == direct.status == 200
    theirs, ours = direct.final()["result"], through.final()["result"]
    assert "idempotency" not in theirs["capabilities"]["tools"]
    assert ours["capabilities"]["tools"].pop("idempotency") == {}
    assert ours == theirs


async def test_session_header_status_codes_and_delete_pass_through(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    session = await open_session_id(client, gateway)
    stateful = session is not None
    listed = await post(
        client, gateway, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session=session
    )
    assert listed.status == 200
    assert len(listed.final()["result"]["tools"]) == 7
    if stateful:
        # A session the upstream does not know: its 404 comes back as it was.
        ping = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
        direct = await post(client, upstream.url, ping, session="no-such-session")
        through = await post(client, gateway, ping, session="no-such-session")
        assert through.status == direct.status == 404
        headers = {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        deleted = await client.delete(gateway, headers=headers)
        assert deleted.status_code in (200, 204)
        gone = await post(client, gateway, ping, session=session)
        assert gone.status == 404
    # GET without a session (stateless) or with one: whatever the upstream says, relayed.
    direct_get = await client.get(upstream.url, headers={"accept": "application/json"})
    through_get = await client.get(gateway, headers={"accept": "application/json"})
    assert through_get.status_code == direct_get.status_code
    assert through_get.content == direct_get.content


async def test_end_to_end_headers_reach_the_upstream_and_hop_by_hop_ones_do_not(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    gateway = gateways(upstream.url, "memory://", "--no-implicit")
    url = gateway_url(gateway)
    sent = {
        "authorization": "Bearer t0ken",
        "x-custom": "kept",
        "connection": "keep-alive, x-hop",
        "x-hop": "dropped",
        "te": "trailers",
    }
    async with httpx.AsyncClient() as client:
        session = await open_session_id(client, url, headers=sent)
        message = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "headers", "arguments": {}},
        }
        answer = await post(client, url, message, session=session, headers=sent)
    seen = answer.final()["result"]["structuredContent"]
    assert seen["authorization"] == "Bearer t0ken"
    assert seen["x-custom"] == "kept"
    assert "x-hop" not in seen and "te" not in seen
    assert seen["host"] == f"127.0.0.1:{upstream.child.port}"  # the upstream's own


async def test_progress_events_reach_the_client_on_the_stream_before_the_result(
    gateway: str, client: httpx.AsyncClient
) -> None:
    session = await open_session_id(client, gateway)
    message = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": "progress", "arguments": {}, "_meta": {"progressToken": "p"}},
    }
    answer = await post(client, gateway, message, session=session, accept=BOTH)
    methods = [m.get("method") for m in answer.messages()]
    if answer.media == "text/event-stream":
        assert methods == ["notifications/progress", "notifications/progress", None]
    else:
        assert methods == [None]  # a JSON answer carries the result only
    assert answer.final()["result"]["content"][0]["text"] == "progress 0 done"


async def test_an_unreachable_upstream_is_a_502_from_the_gateway(
    gateways: Callable[..., Child],
) -> None:
    gateway = gateways(f"http://127.0.0.1:{free_port()}/mcp")
    async with httpx.AsyncClient() as client:
        answer = await post(
            client, gateway_url(gateway), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        )
    assert answer.status == 502
    assert b"could not be reached" in answer.body
