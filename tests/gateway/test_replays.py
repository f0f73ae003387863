"""What the gateway records and replays, byte for byte, and the replay marker (issue 28)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.gateway.conftest import ONE_MODE
from tests.gateway.rpc import call, post
from tests.gateway.upstream import EXACT_RESULT

if TYPE_CHECKING:
    import httpx

    from tests.gateway.processes import Upstream

pytestmark = ONE_MODE

MARKED_RESULT = b'{"_meta":{"' + REPLAYED_META_KEY.encode() + b'":true},' + EXACT_RESULT[1:]


@pytest.mark.parametrize("form", ["event", "json"])
async def test_a_replay_carries_the_upstreams_own_result_bytes(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient, form: str
) -> None:
    arguments = {"json": form == "json"}
    first = await post(client, gateway, call(1, "exact", arguments, idempotencyKey="k-exact"))
    replay = await post(
        client,
        gateway,
        call("retry", "exact", arguments, idempotencyKey="k-exact"),
        accept="application/json",
    )
    assert upstream.executions("exact") == ["exact"]
    assert EXACT_RESULT in first.body  # relayed as the upstream wrote it
    # 1e400 stays 1e400 (not Infinity, which is not JSON); 1.0, -0.0, \u00e9 and spacing stay.
    assert replay.body == b'{"jsonrpc":"2.0","id":"retry","result": ' + MARKED_RESULT + b"}"


async def test_only_replays_carry_the_replay_marker(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    first, replay = [
        (await post(client, gateway, call(n, "record", {"n": 7}, idempotencyKey="k-m"))).final()
        for n in (1, 2)
    ]
    assert REPLAYED_META_KEY not in first["result"].get("_meta", {})
    # FastMCP's own _meta members stay: the marker joins them.
    assert replay["result"]["_meta"].pop(REPLAYED_META_KEY) is True
    assert replay == {**first, "id": 2}
    assert upstream.executions("record") == ["record"]


@pytest.mark.parametrize("form", ["event", "json"])
async def test_a_cancelled_answer_is_never_recorded(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient, form: str
) -> None:
    arguments = {"json": form == "json"}
    for n in (1, 2):
        answer = await post(client, gateway, call(n, "cancelled", arguments, idempotencyKey="c"))
        assert answer.final()["error"] == {"code": -32800, "message": "Request cancelled"}
    # The key was released: the retry ran the tool again instead of replaying the cancel.
    assert upstream.executions("cancelled") == ["cancelled"] * 2
