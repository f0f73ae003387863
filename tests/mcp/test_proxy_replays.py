"""What the proxy records and replays, byte for byte, and the replay marker (issue 28)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.mcp.mock_server import EXACT_RESULT
from tests.mcp.raw import executions, mock_command, proxy_command

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]

# The replay's result: the server's bytes with the marker spliced in as the first member.
MARKED_RESULT = b'{"_meta":{"' + REPLAYED_META_KEY.encode() + b'":true},' + EXACT_RESULT[1:]


async def _proxy(spawn: Spawn, counter: Path) -> RawPeer:
    return await spawn(proxy_command(server=mock_command("--counter", str(counter))))


async def test_a_replay_carries_the_servers_own_result_bytes(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "exact", arguments={}, idempotencyKey="k-exact")
    await proxy.response(1)
    first = proxy.lines[-1]
    await proxy.call("retry", "exact", arguments={}, idempotencyKey="k-exact")
    await proxy.response("retry")
    replay = proxy.lines[-1]
    assert len(executions(counter)) == 1
    assert EXACT_RESULT in first  # relayed as the server wrote it
    # 1e400 stays 1e400 (not Infinity, which is not JSON); 1.0, -0.0, \u00e9 and spacing stay.
    assert replay == b'{"jsonrpc":"2.0","id":"retry","result": ' + MARKED_RESULT + b"}\n"


async def test_only_replays_carry_the_replay_marker(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    first, replay = await proxy.call_each(
        (1, 2), "charge", arguments={"amount": 1}, idempotencyKey="k-m"
    )
    assert "_meta" not in first["result"]
    assert replay["result"]["_meta"] == {REPLAYED_META_KEY: True}
    del replay["result"]["_meta"]
    assert replay["result"] == first["result"]


@pytest.mark.parametrize(
    ("tool", "error", "runs"),
    [
        # A tool's error is recorded and replayed as it was: errors carry no marker.
        ("fail", {"code": -32001, "message": "the tool failed (execution 1)"}, 1),
        # A cancel is released, not recorded: the retry runs the tool again.
        ("cancelled", {"code": -32800, "message": "Request cancelled"}, 2),
    ],
    ids=["a-replayed-error-is-left-unmarked", "a-cancelled-answer-is-never-recorded"],
)
async def test_an_error_is_replayed_unmarked_and_a_cancel_never(
    spawn: Spawn, counter: Path, tool: str, error: dict[str, Any], runs: int
) -> None:
    proxy = await _proxy(spawn, counter)
    answers = await proxy.call_each((1, 2), tool, arguments={}, idempotencyKey="k-" + tool)
    assert [answer["error"] for answer in answers] == [error, error]
    assert len(executions(counter)) == runs
    # Each answer, replayed or not, carries its own request's id.
    assert [json.loads(line).get("id") for line in proxy.lines] == [1, 2]
