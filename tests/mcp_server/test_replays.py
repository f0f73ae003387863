"""The server adapters' replays carry the replay marker; cancelled calls are never recorded."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.mcp_server.conftest import error_of

if TYPE_CHECKING:
    from mcp.shared.exceptions import MCPError

    from tests.mcp_server.conftest import Harness


def _marker_popped(result: dict[str, Any] | MCPError) -> object:
    """The marker's value, removed from ``result`` (with a ``_meta`` it leaves empty)."""
    assert isinstance(result, dict), f"expected a result, got {result!r}"
    meta = result.get("_meta", {})
    value = meta.pop(REPLAYED_META_KEY, None)
    if "_meta" in result and not meta:
        del result["_meta"]
    return value


@pytest.mark.parametrize("tool", ["charge", "fail_result", "explode"])
async def test_only_replays_carry_the_replay_marker(harness: Harness, tool: str) -> None:
    # explode: FastMCP turns the ToolError into an isError result; the low-level adapter's
    # exception is a JSON-RPC error (left unmarked, like every replayed error).
    first = await harness.call(tool, {}, key=f"k-{tool}")
    replay = await harness.call(tool, {}, key=f"k-{tool}")
    assert harness.tools.count(tool) == 1
    if harness.adapter == "lowlevel" and tool == "explode":
        assert error_of(replay) == error_of(first)
        return
    assert _marker_popped(first) is None
    assert _marker_popped(replay) is True
    assert replay == first


async def test_a_call_the_client_cancelled_is_not_recorded(harness: Harness) -> None:
    arguments = {"amount": 3, "seconds": 0.0}
    original = asyncio.create_task(harness.call("slow", arguments, key="k-cancel"))
    await harness.tools.started.wait()
    original.cancel()  # the SDK client sends notifications/cancelled
    await asyncio.gather(original, return_exceptions=True)
    await harness.tools.interrupted.wait()  # the server interrupted the tool
    harness.tools.gate.set()
    for _ in range(100):  # the server releases the key once its handler has stopped
        retry = await harness.call("slow", arguments, key="k-cancel")
        if not (isinstance(retry, Exception) and "in progress" in str(retry)):
            break
        await asyncio.sleep(0.02)
    assert isinstance(retry, dict), retry
    assert harness.tools.count("slow") == 2  # ran again: no "Request cancelled" replayed


@pytest.mark.parametrize("adapter", ["lowlevel"])
async def test_a_request_cancelled_error_is_never_recorded(harness: Harness) -> None:
    for _ in range(2):
        error = error_of(await harness.call("relay_cancelled", {}, key="k-relay"))
        assert error == {"code": -32800, "message": "Request cancelled"}
    assert harness.tools.count("relay_cancelled") == 2
