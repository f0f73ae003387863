"""The real ``mcp`` SDK client (2.x) through ``idemstore proxy``, in both connection eras."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.mcp.raw import ENV, executions, mock_command, proxy_command, until_executed

if TYPE_CHECKING:
    from pathlib import Path

# "legacy": the initialize handshake; "auto": server/discover (the stateless 2026-07-28 era).
MODES = ["legacy", "auto"]


def _through_proxy(counter: Path, *server_options: str) -> StdioServerParameters:
    command = proxy_command(server=mock_command("--counter", str(counter), *server_options))
    return StdioServerParameters(command=command[0], args=command[1:], env=ENV)


def _text(result: Any) -> str:
    return str(result.content[0].text)


@pytest.mark.parametrize("mode", MODES)
async def test_connects_in_either_era(counter: Path, mode: str) -> None:
    async with Client(_through_proxy(counter), mode=mode) as client:
        expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names[:2] == ["charge", "echo"]


@pytest.mark.parametrize("mode", MODES)
async def test_five_identical_calls_execute_once(counter: Path, mode: str) -> None:
    async with Client(_through_proxy(counter), mode=mode) as client:
        results = [await client.call_tool("charge", {"amount": 42}) for _ in range(5)]
    assert {_text(r) for r in results} == {"charged 42 (execution 1)"}
    assert len(executions(counter)) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_retry_racing_an_in_flight_call_fires_the_handler_once(
    counter: Path, mode: str
) -> None:
    # The server holds the first answer back, as if it were lost; the client retries meanwhile.
    async with Client(_through_proxy(counter, "--hold-first", "1"), mode=mode) as client:
        original = asyncio.create_task(client.call_tool("charge", {"amount": 5}))
        await until_executed(counter)
        retry = await client.call_tool("charge", {"amount": 5})
        assert _text(retry) == _text(await original) == "charged 5 (execution 1)"
    assert len(executions(counter)) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_meta_key_reused_with_other_arguments_is_a_conflict(counter: Path, mode: str) -> None:
    async with Client(_through_proxy(counter), mode=mode) as client:
        meta = {"idempotency-key": "order-7"}
        first = await client.call_tool("charge", {"amount": 7}, meta=meta)
        again = await client.call_tool("charge", {"amount": 7}, meta=meta)
        assert _text(again) == _text(first)
        with pytest.raises(MCPError) as conflict:
            await client.call_tool("charge", {"amount": 8}, meta=meta)
    assert conflict.value.error.data == {
        "type": "idempotency_key_conflict",
        "idempotencyKey": "order-7",
    }
    assert len(executions(counter)) == 1


async def test_a_timed_out_call_is_cancelled_by_the_sdk_so_its_retry_runs_again(
    counter: Path,
) -> None:
    # The SDK sends notifications/cancelled when it gives up waiting, and a cancelled call
    # releases its derived key: the retry really runs (no SEP key was there to keep it).
    async with Client(_through_proxy(counter, "--drop-first", "1"), mode="legacy") as client:
        with pytest.raises(MCPError):
            await client.call_tool("charge", {"amount": 3}, read_timeout_seconds=0.5)
        retry = await client.call_tool("charge", {"amount": 3})
    assert _text(retry) == "charged 3 (execution 2)"
    assert len(executions(counter)) == 2
