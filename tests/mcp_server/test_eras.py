"""A recorded outcome replays valid on a connection of the other protocol era (both adapters).

The official client validates a 2026-07-28 result (``resultType`` is required there); a
2025-era connection must get no 2026 vocabulary (``resultType``, the ``serverInfo`` stamp).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mcp_types as types
import pytest
from mcp_types import SERVER_INFO_META_KEY
from pydantic import TypeAdapter

from tests.mcp_server.conftest import KeyedCall, KeyedParams, connect
from tests.mcp_server.servers import Tools, build

if TYPE_CHECKING:
    from mcp import Client

    from idemstore.protocol import IdempotencyStore

_RAW = TypeAdapter(dict[str, Any])


def _charge(key: str) -> KeyedCall:
    return KeyedCall(
        params=KeyedParams(name="charge", arguments={"amount": 5}, idempotency_key=key)
    )


async def _validated(client: Client, key: str) -> types.CallToolResult:
    """The call as the official client validates a result for this connection's era."""
    return await client.session.send_request(_charge(key), types.CallToolResult)


@pytest.mark.parametrize(("first", "second"), [("legacy", "modern"), ("modern", "legacy")])
async def test_outcome_recorded_in_one_era_replays_valid_in_the_other(
    adapter: str, store: IdempotencyStore, first: str, second: str
) -> None:
    tools = Tools()
    server = build(adapter, tools, store)
    async with connect(server, first) as client:
        original = await _validated(client, "era-1")
    async with connect(server, second) as client:
        replay = await _validated(client, "era-1")
        raw = await client.session.send_request(_charge("era-1"), _RAW)
    assert tools.count("charge") == 1
    assert replay.content == original.content
    assert replay.is_error is False
    meta = raw.get("_meta") or {}
    if second == "modern":
        assert raw["resultType"] == "complete"
    else:
        assert "resultType" not in raw
        assert SERVER_INFO_META_KEY not in meta
