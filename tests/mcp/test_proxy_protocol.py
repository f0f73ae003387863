"""The proxy on the wire: raw JSON-RPC lines in, raw lines out, executions counted."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.mcp.raw import executions, mock_command, proxy_command, unmarked, until_executed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]


def _text(response: dict[str, Any]) -> str:
    return str(response["result"]["content"][0]["text"])


async def _proxy(
    spawn: Spawn,
    counter: Path,
    *options: str,
    server: tuple[str, ...] = (),
    log: Path | None = None,
) -> RawPeer:
    """The proxy in front of the mock server, which counts executions in ``counter`` and,
    given ``log``, writes there each request it receives."""
    if log is not None:
        server = ("--log", str(log), *server)
    return await spawn(
        proxy_command(*options, server=mock_command("--counter", str(counter), *server))
    )


@pytest.fixture
def received_log(tmp_path: Path) -> Path:
    """Where the mock server writes the requests it receives (``_proxy(..., log=...)``)."""
    return tmp_path / "received.log"


def _received(log: Path) -> list[bytes]:
    """The requests the mock server received, one raw line each."""
    return log.read_bytes().splitlines(keepends=True)


async def test_initialize_result_gains_the_idempotency_capability(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    response = await proxy.initialize()
    assert response["result"]["capabilities"]["tools"] == {"listChanged": False, "idempotency": {}}
    assert await proxy.close() == 0


async def test_discover_result_gains_the_idempotency_capability(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    response = await proxy.request(1, "server/discover", {"_meta": meta})
    result = response["result"]
    assert result["capabilities"]["tools"]["idempotency"] == {}
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["_meta"] == {
        "io.modelcontextprotocol/serverInfo": {"name": "mock", "version": "1.0"}
    }


async def test_other_messages_pass_byte_for_byte(
    spawn: Spawn, counter: Path, tmp_path: Path, received_log: Path
) -> None:
    direct = await spawn(mock_command("--log", str(tmp_path / "direct.log")))
    proxy = await _proxy(spawn, counter, log=received_log)
    odd = b'{ "id" : 7,"jsonrpc":"2.0",  "method":"tools/list", "params":{"x":"\\u00e9\\/"}}\n'
    for peer in (direct, proxy):
        await peer.send(odd)
        await peer.response(7)
    assert proxy.lines == direct.lines  # the server's own bytes, spacing and all
    assert _received(received_log) == [odd]


async def test_five_identical_calls_execute_once(
    spawn: Spawn, counter: Path, tmp_path: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    answers = await proxy.call_each(range(1, 6), "charge", arguments={"amount": 42})
    assert len(executions(counter)) == 1
    assert {_text(a) for a in answers} == {"charged 42 (execution 1)"}
    # Without the proxy the same five calls run five times.
    direct_counter = tmp_path / "direct.jsonl"
    direct = await spawn(mock_command("--counter", str(direct_counter)))
    await direct.call_each(range(1, 6), "charge", arguments={"amount": 42})
    assert len(executions(direct_counter)) == 5


async def test_retry_racing_an_in_flight_call_executes_once(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter, server=("--hold-first", "1"))
    await proxy.call("original", "charge", arguments={"amount": 5})
    await until_executed(counter)  # the side effect happened; its answer is held back
    await proxy.call("retry", "charge", arguments={"amount": 5})
    retry = await proxy.response("retry")
    original = await proxy.response("original")
    assert len(executions(counter)) == 1
    assert unmarked(retry["result"]) == original["result"]


async def test_replay_carries_the_retrys_own_id(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "charge", arguments={"amount": 1}, idempotencyKey="order-1")
    first = await proxy.response(1)
    await proxy.call("retry-1", "charge", arguments={"amount": 1}, idempotencyKey="order-1")
    replay = await proxy.response("retry-1")
    assert {**replay, "result": unmarked(replay["result"])} == {**first, "id": "retry-1"}


async def test_meta_and_argument_order_do_not_change_the_derived_key(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "charge", arguments={"amount": 1, "note": "a"}, _meta={"progressToken": 1})
    await proxy.response(1)
    await proxy.send(
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"progressToken":"x"},'
        b'"arguments":{"note":"\\u0061","amount":1.0},"name":"charge"}}\n'
    )
    assert _text(await proxy.response(2)) == "charged 1 (execution 1)"
    assert len(executions(counter)) == 1


async def test_a_tool_name_too_long_for_a_key_is_still_deduplicated(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    answers = await proxy.call_each((1, 2), "t" * 300, arguments={})
    assert [_text(answer) for answer in answers] == ["t" * 300 + " (execution 1)"] * 2
    assert len(executions(counter)) == 1


async def test_sep_key_is_stripped_before_forwarding(
    spawn: Spawn, counter: Path, received_log: Path
) -> None:
    proxy = await _proxy(spawn, counter, server=("--strict",), log=received_log)
    await proxy.call(1, "charge", arguments={"amount": 3}, idempotencyKey="k-1")
    response = await proxy.response(1)
    assert _text(response) == "charged 3 (execution 1)"  # a strict server did not reject it
    (forwarded,) = [json.loads(line) for line in _received(received_log)]
    assert forwarded["params"] == {"name": "charge", "arguments": {"amount": 3}}
    assert forwarded["id"] == 1


async def test_sep_duplicate_in_flight_is_rejected_at_once(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)  # --in-flight wait applies to other keys only
    arguments = {"amount": 9, "seconds": 1}
    await proxy.call(1, "charge", arguments=arguments, idempotencyKey="k-busy")
    await until_executed(counter)
    await proxy.call(2, "charge", arguments=arguments, idempotencyKey="k-busy")
    rejected = await proxy.response(2, timeout=0.9)  # long before the original answers
    assert rejected["error"]["data"] == {
        "type": "idempotency_key_in_progress",
        "idempotencyKey": "k-busy",
    }
    original = await proxy.response(1)
    await proxy.call(3, "charge", arguments=arguments, idempotencyKey="k-busy")
    assert unmarked((await proxy.response(3))["result"]) == original["result"]
    assert len(executions(counter)) == 1


async def test_sep_key_with_other_arguments_is_a_conflict(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "charge", arguments={"amount": 1}, idempotencyKey="k-2")
    await proxy.response(1)
    await proxy.call(2, "charge", arguments={"amount": 2}, idempotencyKey="k-2")
    conflict = await proxy.response(2)
    assert conflict["error"]["data"] == {
        "type": "idempotency_key_conflict",
        "idempotencyKey": "k-2",
    }
    assert len(executions(counter)) == 1


async def test_meta_key_with_other_arguments_is_a_conflict(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "charge", arguments={"amount": 1}, _meta={"idempotency-key": "m-1"})
    await proxy.response(1)
    await proxy.call(2, "charge", arguments={"amount": 1}, _meta={"idempotency-key": "m-1"})
    assert _text(await proxy.response(2)) == "charged 1 (execution 1)"
    await proxy.call(3, "charge", arguments={"amount": 2}, _meta={"idempotency-key": "m-1"})
    assert (await proxy.response(3))["error"]["data"]["type"] == "idempotency_key_conflict"
    assert len(executions(counter)) == 1


async def test_sep_key_replays_an_error_outcome(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    first, second = await proxy.call_each((1, 2), "fail", arguments={}, idempotencyKey="k-fail")
    assert (
        second["error"]
        == first["error"]
        == {
            "code": -32001,
            "message": "the tool failed (execution 1)",
        }
    )
    assert len(executions(counter)) == 1


async def test_sep_key_does_not_record_a_refusal(
    spawn: Spawn, counter: Path, received_log: Path
) -> None:
    # A strict server refuses an unknown param before any tool runs: nothing to replay.
    proxy = await _proxy(spawn, counter, server=("--strict",), log=received_log)
    answers = await proxy.call_each((1, 2), "charge", arguments={}, idempotencyKey="k-r", extra=1)
    assert [answer["error"]["code"] for answer in answers] == [-32602, -32602]
    assert len(_received(received_log)) == 2
    assert executions(counter) == []


async def test_server_error_is_not_cached_for_meta_keys(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    meta = {"idempotency-key": "m-fail"}
    answers = await proxy.call_each((1, 2), "fail", arguments={}, _meta=meta)
    assert all("error" in answer for answer in answers)
    assert len(executions(counter)) == 2


async def test_tool_error_results_are_replayed(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    answers = await proxy.call_each((1, 2), "tool_error", arguments={})
    assert [answer["result"]["isError"] for answer in answers] == [True, True]
    assert len(executions(counter)) == 1


async def test_waiting_duplicate_re_executes_after_a_server_error(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "fail", arguments={"seconds": 0.5})
    await until_executed(counter)
    await proxy.call(2, "fail", arguments={"seconds": 0.5})  # waits for the original
    first, second = await proxy.response(1), await proxy.response(2)
    assert first["error"]["message"] == "the tool failed (execution 1)"
    assert second["error"]["message"] == "the tool failed (execution 2)"
    assert len(executions(counter)) == 2


async def test_in_flight_reject_option_rejects_derived_duplicates(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter, "--in-flight", "reject")
    await proxy.call(1, "charge", arguments={"amount": 1, "seconds": 1})
    await until_executed(counter)
    await proxy.call(2, "charge", arguments={"amount": 1, "seconds": 1})
    assert (await proxy.response(2))["error"]["data"]["type"] == "idempotency_key_in_progress"
    assert "result" in await proxy.response(1)


async def test_cancelling_the_original_releases_its_key(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter, server=("--drop-first", "1"))
    await proxy.call(1, "charge", arguments={"amount": 1})
    await until_executed(counter)  # executed, but its answer never comes
    await proxy.send(
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 1, "reason": "timed out"},
        }
    )
    await proxy.call(2, "charge", arguments={"amount": 1})
    assert _text(await proxy.response(2)) == "charged 1 (execution 2)"


async def test_cancelling_a_sep_original_keeps_its_key_until_the_server_answers(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter, server=("--hold-first", "1"))
    await proxy.call(1, "charge", arguments={"amount": 1}, idempotencyKey="k-cancel")
    await until_executed(counter)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    await proxy.send(cancel)
    await proxy.call(2, "charge", arguments={"amount": 1}, idempotencyKey="k-cancel")
    assert (await proxy.response(2))["error"]["data"]["type"] == "idempotency_key_in_progress"
    original = await proxy.response(1)  # this mock answers even a cancelled call
    await proxy.call(3, "charge", arguments={"amount": 1}, idempotencyKey="k-cancel")
    assert unmarked((await proxy.response(3))["result"]) == original["result"]
    assert len(executions(counter)) == 1


async def test_cancelling_a_waiting_duplicate_answers_nothing_and_forwards_nothing(
    spawn: Spawn, counter: Path, received_log: Path
) -> None:
    proxy = await _proxy(spawn, counter, log=received_log)
    await proxy.call(1, "charge", arguments={"amount": 1, "seconds": 0.5})
    await until_executed(counter)
    await proxy.call(2, "charge", arguments={"amount": 1, "seconds": 0.5})
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    await proxy.send(cancel)
    assert "result" in await proxy.response(1)
    assert await proxy.request(3, "ping") == {"jsonrpc": "2.0", "id": 3, "result": {}}
    assert not [m for m in proxy._unclaimed if m.get("id") == 2]
    methods = [json.loads(line).get("method") for line in _received(received_log)]
    assert methods == ["tools/call", "ping"]


async def test_server_crash_answers_pending_calls_and_exits_with_its_status(
    spawn: Spawn, counter: Path
) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.call(1, "charge", arguments={"amount": 1, "seconds": 5})
    await until_executed(counter)
    await proxy.call(2, "charge", arguments={"amount": 1, "seconds": 5})  # waits for 1
    await proxy.call(3, "crash", arguments={})
    for request_id in (1, 2, 3):
        error = (await proxy.response(request_id))["error"]
        assert error["data"] == {"type": "mcp_server_exited"}
    assert await asyncio.wait_for(proxy.process.wait(), 20) == 3


async def test_mrtr_continuations_pass_untouched_and_input_required_is_not_cached(
    spawn: Spawn, counter: Path, received_log: Path
) -> None:
    proxy = await _proxy(spawn, counter, log=received_log)
    for request_id in (1, 2):
        await proxy.call(request_id, "ask", arguments={})
        response = await proxy.response(request_id)
        assert response["result"]["resultType"] == "input_required"
    continuation = (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ask","arguments":{},'
        b'"requestState":"state-1","inputResponses":{"q":{"action":"accept"}},'
        b'"idempotencyKey":"k-mrtr"}}\n'
    )
    await proxy.send(continuation)
    assert _text(await proxy.response(3)) == "ask (execution 1)"
    lines = _received(received_log)
    assert len(lines) == 3  # both first rounds reached the server
    assert lines[2] == continuation


async def test_malformed_input_never_crashes_the_proxy(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    await proxy.send(b"this is not json\n")
    assert (await proxy.response(None))["error"]["code"] == -32700  # the server's answer
    await proxy.send(b"\xff\xfe\x00 not utf-8\n")
    assert (await proxy.response(None))["error"]["code"] == -32700
    await proxy.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})  # no params
    await proxy.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": []})
    await proxy.call(3, "charge", arguments={"amount": 1}, idempotencyKey=17)
    await proxy.call(4, "charge", arguments={"amount": 1}, idempotencyKey="")
    await proxy.call(5, "charge", arguments={"amount": 1}, idempotencyKey="x" * 300)
    await proxy.send(
        b'{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"charge",'
        b'"arguments":{"amount":NaN},"idempotencyKey":"k"}}\n'
    )
    for request_id in (3, 4, 5, 6):
        error = (await proxy.response(request_id))["error"]
        assert error["code"] == -32602 and error["data"]["type"] == "idempotency_key_invalid"
    await proxy.send([{"jsonrpc": "2.0", "id": 7, "method": "ping"}])  # a batch: relayed
    assert (await proxy.response(None))["error"]["message"] == "batches are not supported"
    await proxy.send(b"\n")
    assert await proxy.request(8, "ping") == {"jsonrpc": "2.0", "id": 8, "result": {}}
    assert len(executions(counter)) == 2  # requests 1 and 2 reached the server as they were
    assert await proxy.close() == 0


async def test_ten_megabyte_lines_pass_both_ways_and_replay(spawn: Spawn, counter: Path) -> None:
    proxy = await _proxy(spawn, counter)
    text = "x" * (10 * 1024 * 1024)
    for request_id in (1, 2):
        await proxy.call(request_id, "echo", arguments={"text": text})
        assert _text(await proxy.response(request_id, timeout=60)) == text
    assert len(executions(counter)) == 1


async def test_no_implicit_and_tool_globs_choose_what_gets_derived_keys(
    spawn: Spawn, tmp_path: Path
) -> None:
    choices = (("--no-implicit",), ("--exclude-tools", "ch*"), ("--tools", "echo", "fail"))
    for index, options in enumerate(choices):
        counter = tmp_path / f"executions-{index}.jsonl"
        proxy = await _proxy(spawn, counter, *options)
        for request_id in (1, 2):
            await proxy.call(request_id, "charge", arguments={"amount": 1})
            await proxy.response(request_id)
        await proxy.call(3, "charge", arguments={"amount": 1}, idempotencyKey="still-honoured")
        first = await proxy.response(3)
        await proxy.call(4, "charge", arguments={"amount": 1}, idempotencyKey="still-honoured")
        assert unmarked((await proxy.response(4))["result"]) == first["result"]
        assert len(executions(counter)) == 3, options
        assert await proxy.close() == 0
