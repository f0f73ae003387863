"""The MCP relay core (``ToolCallCore``) on its own, with an exchange in this process.

Runs in the fast lane on every Python, so both ways a call task starts are covered: eagerly on
3.12+ (the call is forwarded, or answered, before ``start`` returns) and on the next turn of
the loop on 3.11. Either way a call runs its work once, and a finished call leaves nothing
behind in the core.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from idemstore.backends.memory import MemoryStore
from idemstore.execution.eager_tasks import EAGER
from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from idemstore.mcp.tool_calls import ServerResponse, ToolCall, ToolCallCore, decoded


def tools_call(request_id: int, **arguments: Any) -> tuple[dict[str, Any], bytes]:
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "charge", "arguments": arguments},
    }
    return message, json.dumps(message).encode() + b"\n"


class Server:
    """Answers every forwarded call at once, counting the calls it saw."""

    def __init__(self) -> None:
        self.forwarded: list[bytes] = []

    async def exchange(self, forward: bytes) -> ServerResponse:
        self.forwarded.append(forward)
        request = json.loads(forward)
        message = {"jsonrpc": "2.0", "id": request["id"], "result": {"n": len(self.forwarded)}}
        return ServerResponse(message, json.dumps(message).encode() + b"\n")


def prepared(core: ToolCallCore, request_id: int) -> ToolCall:
    call = core.prepare(*tools_call(request_id, amount=5))
    assert isinstance(call, ToolCall)
    return call


async def test_a_retry_replays_and_a_finished_call_leaves_nothing_behind() -> None:
    core = ToolCallCore(MemoryStore())
    server = Server()
    answers: list[bytes] = []

    async def reply(line: bytes) -> None:
        answers.append(line)

    first = core.start(prepared(core, 1), server.exchange, reply)
    # On 3.12+ the whole call ran before start returned: the memory store answers inline and
    # this server answers without suspending.
    assert first.done() is EAGER
    assert json.loads(await first)["result"] == {"n": 1}
    retry = core.start(prepared(core, 2), server.exchange, reply)
    replayed = json.loads(await retry)
    assert replayed["id"] == 2
    assert replayed["result"] == {"_meta": {REPLAYED_META_KEY: True}, "n": 1}
    assert len(server.forwarded) == 1
    assert [json.loads(line)["id"] for line in answers] == [1, 2]
    assert not core.busy and not core.tasks


async def test_a_call_cancelled_before_it_was_forwarded_leaves_nothing_behind() -> None:
    core = ToolCallCore(MemoryStore())
    release = asyncio.Event()
    forwarded: list[bytes] = []

    async def slow_exchange(forward: bytes) -> ServerResponse:
        await release.wait()
        forwarded.append(forward)
        raise AssertionError("a call cancelled before it was forwarded is never answered")

    task = core.start(prepared(core, 1), slow_exchange)
    if not EAGER:
        # On 3.11 the task has not run a step yet: cancelling it now runs none of its body.
        assert core.cancel(1) is False
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert not core.busy and not core.tasks
        await asyncio.wait_for(core.wait_forwarded(), 1)
    else:
        # Eagerly started, the call was marked forwarded before it reached the exchange: the
        # server must get the cancel too, and the key stays held until the call ends.
        assert core.cancel(1) is True
        await core.close()
        assert not core.tasks
    assert forwarded == []


async def _a_holder_died(store: MemoryStore, call: ToolCall) -> None:
    """A relay that reserved ``call``'s key and died: its lease lapses, no outcome."""
    await store.reserve(call.key, call.fingerprint, scope=call.scope, lease_ttl=0.05, retention=60)
    await asyncio.sleep(0.1)


async def test_a_takeover_runs_the_call_again_by_default() -> None:
    store = MemoryStore()
    core = ToolCallCore(store)
    server = Server()
    call = prepared(core, 1)
    await _a_holder_died(store, call)
    answer = json.loads(await core.start(call, server.exchange))
    assert answer["result"] == {"n": 1}
    assert len(server.forwarded) == 1


async def test_a_takeover_is_refused_as_outcome_unknown_when_the_relay_says_so() -> None:
    store = MemoryStore()
    core = ToolCallCore(store, on_takeover="refuse")
    server = Server()
    call = prepared(core, 1)
    await _a_holder_died(store, call)
    for request_id in (1, 2):  # the takeover, and every retry after it
        answer = json.loads(await core.start(prepared(core, request_id), server.exchange))
        assert answer["error"]["data"]["type"] == "idempotency_outcome_unknown"
    assert server.forwarded == []


@pytest.mark.parametrize(
    "line",
    [
        b'{"a":1}\n',
        b'{"a":1}\r\n',
        b'  {"a":1}',
        b"[1]",
        b'{"a":1} x',
        b'{"a":1}{"b":2}',
        b'{"a":1}\x0b',  # a vertical tab is not JSON's whitespace
        b'{"a":',
        b'{"a":NaN, "b": 1e400}',
        b'{"a":"\xed\xa0\x80"}',  # a lone surrogate, as json.loads lets it pass
        b"{\x00",
        '{"é":1}'.encode("utf-16"),
        b"{" * 100_000,
    ],
)
def test_a_message_is_read_as_json_loads_reads_it(line: bytes) -> None:
    try:
        expected = json.loads(line)
    except (ValueError, RecursionError):
        expected = None
    assert repr(decoded(line)) == repr(expected)
