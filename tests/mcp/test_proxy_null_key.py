"""Case 7: ``idempotencyKey: null`` reads as no key in the proxy, as in the server adapters."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.mcp.raw import executions, mock_command, proxy_command

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]


async def test_a_null_key_is_read_as_absent_and_never_reaches_the_server(
    spawn: Spawn, counter: Path, tmp_path: Path
) -> None:
    log = tmp_path / "received.log"
    # --strict: the server rejects params it does not know, as a strict server may.
    server = mock_command("--counter", str(counter), "--strict", "--log", str(log))
    proxy = await spawn(proxy_command(server=server))
    answers = []
    for request_id in (1, 2):
        await proxy.call(request_id, "charge", arguments={"amount": 3}, idempotencyKey=None)
        answers.append(await proxy.response(request_id))
    # No -32602: the call ran, under the derived key a keyless call gets (so the identical
    # retry replays), and the server never saw the field.
    assert [a["result"]["content"][0]["text"] for a in answers] == ["charged 3 (execution 1)"] * 2
    assert len(executions(counter)) == 1
    forwarded = [json.loads(line) for line in log.read_text().splitlines()]
    assert [m["params"] for m in forwarded] == [{"name": "charge", "arguments": {"amount": 3}}]


async def test_a_null_key_without_derived_keys_runs_every_time(spawn: Spawn, counter: Path) -> None:
    server = mock_command("--counter", str(counter), "--strict")
    proxy = await spawn(proxy_command("--no-implicit", server=server))
    for request_id in (1, 2):
        await proxy.call(request_id, "charge", arguments={"amount": 3}, idempotencyKey=None)
        assert "result" in await proxy.response(request_id)
    assert len(executions(counter)) == 2
