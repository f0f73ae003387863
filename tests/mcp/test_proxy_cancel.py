"""Cases 2 and 3 of issue 14: a client's ``notifications/cancelled`` through the proxy.

Case 2: the cancel arrives while the proxy's ``reserve`` is on a slow network (the fault
proxy delays the store's traffic): the key must not be left held by a lease nobody owns.
Case 3: a SEP-3182 call cancelled while a slow server still executes it: the proxy keeps the
key alive for as long as the call is in flight, so a retry after the lease would have lapsed
is rejected as in progress (SEP-3182: MUST NOT begin a second execution), and once the
server answers, the retry gets the recorded outcome.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest

from idemstore import Status, open_store
from idemstore.hashing import fingerprint
from idemstore.testing import FaultProxy
from tests.mcp.raw import executions, mock_command, proxy_command, unmarked, until_executed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]

LATENCY = 1.0  # seconds per chunk, each way: the window in which the client cancels
KEY_SCOPE = "cancel-tests"
RUN_ID = "cancel-run"


def _cancel(request_id: object) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id},
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sep", "derived"])
async def test_cancel_while_the_proxy_reserves_leaves_no_orphan_lease(
    request: pytest.FixtureRequest, spawn: Spawn, counter: Path, kind: str
) -> None:
    direct_url = request.getfixturevalue("redis_store_url")
    arguments = {"amount": 7}
    extra = {"idempotencyKey": f"slow-{kind}"} if kind == "sep" else {}
    if kind == "sep":
        key, scope = f"slow-{kind}", KEY_SCOPE
    else:
        key = "charge:" + fingerprint({"name": "charge", "arguments": arguments})
        scope = f"mcp-proxy/run/{RUN_ID}"
    with FaultProxy.for_url(direct_url) as faults:
        slow_url = faults.route(direct_url) + "&socket_timeout=10"
        options = ("--store", slow_url, "--key-scope", KEY_SCOPE, "--run-id", RUN_ID)
        # A long lease: an orphan would hold the key (and every retry) for 30 s.
        server = mock_command("--counter", str(counter))
        proxy = await spawn(proxy_command(*options, "--lease", "30", server=server))
        await proxy.call(0, "echo", arguments={"text": "warm"})  # connect, load the scripts
        assert "result" in await proxy.response(0)
        faults.latency = LATENCY
        async with open_store(direct_url) as direct:
            await proxy.call(1, "charge", arguments=arguments, **extra)
            # Cancel once the engine holds the key, while the reply is still on the way back.
            async with asyncio.timeout(10):
                while (record := await direct.get(key, scope=scope)) is None:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert record.status is Status.IN_PROGRESS
            await proxy.send(_cancel(1))
            faults.latency = 0.0
            await asyncio.sleep(2 * LATENCY)  # the reserve's reply has arrived and was handled
            assert [e["tool"] for e in executions(counter)] == ["echo"]
            # The identical retry runs at once: no lease nobody owns, no wait for it to lapse.
            await proxy.call(2, "charge", arguments=arguments, **extra)
            retry = await proxy.response(2, timeout=10)
    assert retry["result"]["content"][0]["text"] == "charged 7 (execution 2)", retry
    assert not [line for line in proxy.lines if b'"id":1' in line or b'"id": 1' in line]


@pytest.mark.slow
async def test_a_cancelled_sep_call_keeps_its_key_while_a_slow_server_runs_it(
    spawn: Spawn, counter: Path
) -> None:
    lease = 0.6
    server = mock_command("--counter", str(counter), "--hold-first", "3")
    proxy = await spawn(proxy_command("--lease", str(lease), server=server))
    await proxy.call(1, "charge", arguments={"amount": 1}, idempotencyKey="k-slow")
    await until_executed(counter)
    await proxy.send(_cancel(1))
    await asyncio.sleep(2.5 * lease)  # without heartbeats the lease would have lapsed
    await proxy.call(2, "charge", arguments={"amount": 1}, idempotencyKey="k-slow")
    retry = await proxy.response(2)
    assert retry["error"]["data"]["type"] == "idempotency_key_in_progress", retry
    assert len(executions(counter)) == 1
    original = await proxy.response(1)  # this mock answers even a cancelled call
    await proxy.call(3, "charge", arguments={"amount": 1}, idempotencyKey="k-slow")
    assert unmarked((await proxy.response(3))["result"]) == original["result"]
    assert len(executions(counter)) == 1


@pytest.mark.slow
async def test_a_cancelled_sep_call_the_server_never_answers_frees_its_key_after_the_grace(
    spawn: Spawn, counter: Path
) -> None:
    # MCP servers do not answer a cancelled request: the key cannot stay held forever.
    server = mock_command("--counter", str(counter), "--drop-first", "1")
    proxy = await spawn(proxy_command("--lease", "0.6", "--cancel-grace", "1.5", server=server))
    await proxy.call(1, "charge", arguments={"amount": 1}, idempotencyKey="k-mute")
    await until_executed(counter)
    await proxy.send(_cancel(1))
    await proxy.call(2, "charge", arguments={"amount": 1}, idempotencyKey="k-mute")
    assert (await proxy.response(2))["error"]["data"]["type"] == "idempotency_key_in_progress"
    await asyncio.sleep(2.0)
    await proxy.call(3, "charge", arguments={"amount": 1}, idempotencyKey="k-mute")
    assert (await proxy.response(3))["result"]["content"][0]["text"] == "charged 1 (execution 2)"


@pytest.mark.slow
async def test_a_call_cancelled_in_the_same_write_lets_the_proxy_exit_at_end_of_input(
    spawn: Spawn, counter: Path
) -> None:
    # The cancel is read from the same buffer as its call, before the call's task ran a single
    # step: a task cancelled then runs none of its body, and the proxy's shutdown used to wait
    # forever for that call to be forwarded.
    server = mock_command("--counter", str(counter))
    proxy = await spawn(proxy_command("--store", "memory://", server=server))
    await proxy.initialize()
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "charge", "arguments": {"amount": 3}},
    }
    both = json.dumps(call).encode() + b"\n" + json.dumps(_cancel(1)).encode() + b"\n"
    await proxy.send(both)
    assert await proxy.close(timeout=15) == 0
    # Whether the call reached the server before its cancel depends on the Python (3.12+
    # starts it in the same turn); it ran at most once either way.
    assert len(executions(counter)) <= 1
