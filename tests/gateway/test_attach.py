"""A duplicate that arrives while its original's streamed answer is still being produced in
the same gateway follows that answer live, from its first event, instead of being refused."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.gateway.conftest import ONE_MODE
from tests.gateway.rpc import call, post

if TYPE_CHECKING:
    import httpx

    from tests.gateway.processes import Upstream


def _progress(request_id: int) -> dict[str, Any]:
    message = call(request_id, "progress", {"n": 1, "seconds": 1.0}, idempotencyKey="attach-1")
    message["params"]["_meta"] = {"progressToken": f"p-{request_id}"}
    return message


@ONE_MODE
async def test_a_duplicate_follows_the_running_original_live(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    original = asyncio.ensure_future(post(client, gateway, _progress(1)))
    await upstream.until_executed("progress")
    await asyncio.sleep(0.2)  # the original's first progress event is on its way
    duplicate = await post(client, gateway, _progress(2))
    first = await original
    # Under a SEP-3182 key a duplicate in flight would be refused (in progress): here it gets
    # the original's events, then its final response with its own id, marked as a replay.
    assert duplicate.status == 200 and duplicate.media == "text/event-stream"
    events = duplicate.messages()
    assert [m.get("method") for m in events[:-1]] == ["notifications/progress"] * 2
    final = duplicate.final()
    assert final["id"] == 2
    assert final["result"]["_meta"][REPLAYED_META_KEY] is True
    assert final["result"]["content"] == first.final()["result"]["content"]
    assert REPLAYED_META_KEY not in first.final()["result"].get("_meta", {})
    assert upstream.executions() == ["progress"]


@ONE_MODE
async def test_a_duplicate_after_the_original_ended_gets_the_record(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    first = await post(client, gateway, _progress(1))
    again = await post(client, gateway, _progress(2))
    assert again.final()["result"]["content"] == first.final()["result"]["content"]
    assert [m.get("method") for m in again.messages()] == [None]  # the final response only
    assert upstream.executions() == ["progress"]
