"""The 2026-07-28 revision through the gateway: no session (SEP-2575, SEP-2567) and the
routing headers (SEP-2243), beside a 2025-11-25 client on the same gateway."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.gateway.rpc import BOTH, CALLER, call, post

if TYPE_CHECKING:
    import httpx

    from tests.gateway.processes import Upstream

# The upstream keeps sessions for 2025 clients and none for 2026 ones.
STATEFUL = pytest.mark.parametrize("upstream", ["stateful"], indirect=True)
# Raw requests carry no session: an upstream that wants none.
STATELESS = pytest.mark.parametrize("upstream", ["stateless"], indirect=True)


def _client(gateway: str, mode: str) -> Client:
    transport = streamable_http_client(gateway, http_client=httpx2.AsyncClient(headers=CALLER))
    return Client(transport, mode=mode)  # type: ignore[arg-type]


@STATEFUL
async def test_replays_reach_a_sessionless_2026_client_and_a_2025_client_alike(
    upstream: Upstream, gateway: str
) -> None:
    # The replay probe carries the caller's credentials in the caller's era: a 2026 caller
    # has no session and no ping, so it gets server/discover with its own envelope.
    for n, mode, version in ((1, "legacy", "2025-11-25"), (2, "auto", "2026-07-28")):
        async with _client(gateway, mode) as client:
            assert client.protocol_version == version
            first = await client.call_tool("record", {"n": n})
            retry = await client.call_tool("record", {"n": n})
        assert retry.content[0].text == first.content[0].text == f"recorded {n}"  # type: ignore[union-attr]
        assert (retry.meta or {}).get(REPLAYED_META_KEY) is True, mode
    assert upstream.executions() == ["record", "record"]


def _headers(method: str, name: str | None = None) -> dict[str, Any]:
    headers = {**CALLER, "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return headers


@STATELESS
@pytest.mark.parametrize(
    ("method", "name"), [("tools/list", None), ("tools/call", "look"), ("ping", "record")]
)
async def test_a_tools_call_whose_headers_disagree_with_its_body_is_refused(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient, method: str, name: str | None
) -> None:
    # Mcp-Method names a method the gateway passes unread: trusting it would let a tools/call
    # skip deduplication. The gateway refuses, and the upstream never sees the request.
    message = call(1, "record", {"n": 3})
    answer = await post(client, gateway, message, headers=_headers(method, name))
    assert answer.status == 400
    assert answer.final()["error"]["code"] == -32020
    assert upstream.executions() == []


@STATELESS
async def test_a_request_whose_headers_agree_is_deduplicated(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    message = call(1, "record", {"n": 4})
    answers = [
        await post(client, gateway, message, headers=_headers("tools/call", "record"))
        for _ in range(2)
    ]
    assert [a.status for a in answers] == [200, 200]
    assert answers[1].final()["result"]["_meta"][REPLAYED_META_KEY] is True
    assert upstream.executions() == ["record"]


@STATELESS
async def test_a_tools_call_spelt_with_escapes_cannot_hide_behind_another_method(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools\\/call","params":{"name":"record"}}'
    headers = {**_headers("tools/list"), "accept": BOTH, "content-type": "application/json"}
    answer = await client.post(gateway, content=body, headers=headers)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == -32020
    assert "'tools/list'" in error["message"]  # the gateway's refusal, not the upstream's
    assert upstream.executions() == []


@STATEFUL
async def test_a_2026_client_that_gives_up_cancels_so_its_retry_runs_again(
    upstream: Upstream, gateway: str
) -> None:
    # At 2026-07-28 a client cancels by closing the call's stream (no notifications/cancelled
    # over HTTP): the gateway releases the derived key, as for a 2025 client's cancel.
    async with _client(gateway, "auto") as client:
        with pytest.raises(MCPError):
            await client.call_tool("slow", {"n": 9, "seconds": 1.5}, read_timeout_seconds=0.3)
        await upstream.until_executed("slow")
        retry = await client.call_tool("slow", {"n": 9, "seconds": 1.5})
    assert retry.content[0].text == "slow 9 done"  # type: ignore[union-attr]
    assert (retry.meta or {}).get(REPLAYED_META_KEY) is not True  # run, not waited for
    assert upstream.executions("slow") == ["slow", "slow"]
