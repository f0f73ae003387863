"""The MCP proxy fed malformed lines keeps serving and writes nothing but JSON-RPC to stdout.

``idemstore proxy`` runs in front of the mock server (tests/mcp/mock_server.py) on every store
of the contract suite's list. It gets a fixed corpus (not JSON, invalid UTF-8, empty lines,
JSON of the wrong types, requests without ids, notifications, tools/call with params,
arguments and keys of the wrong types, non-finite ids, 10 MB lines), then hypothesis-drawn
batches of lines, all through one proxy process. After each batch a fresh valid call must
still run once and be replayed to its retry, and every line the proxy ever wrote to stdout must
be a strict JSON-RPC 2.0 object (or a batch of them).

The mock server itself is fragile where a real server would not be (a deeply nested line or
non-dict params for ``initialize`` stop it; ``NaN`` ids it echoes as ``NaN``), so the random
lines stay clear of those: they test the proxy, not the mock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from idemstore.backends.registry import fixture_variants
from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.mcp.raw import ROOT, RawPeer, executions, mock_command, proxy_command, unmarked
from tests.reliability.hypothesis_settings import OVER_ONE_FIXTURE

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = pytest.mark.slow

TEN_MB = 10 * 1024 * 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json_rpc(line: bytes) -> None:
    """``line`` is one strict JSON-RPC 2.0 message (or batch): UTF-8, no NaN/Infinity."""
    assert line.endswith(b"\n"), line[:200]
    message = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
    for item in message if isinstance(message, list) else [message]:
        assert isinstance(item, dict), line[:200]
        assert item.get("jsonrpc") == "2.0", line[:200]
        assert "id" in item or "method" in item, line[:200]


class Proxy:
    """One ``idemstore proxy`` process and the bookkeeping of what it wrote."""

    def __init__(self, peer: RawPeer, counter: Path) -> None:
        self.peer = peer
        self.counter = counter
        self.lines_sent = 0
        self.amounts = itertools.count(10**12, 2)  # each check uses two amounts

    async def send_lines(self, lines: list[bytes]) -> None:
        for line in lines:
            await self.peer.send(line)
            self.lines_sent += 1

    async def still_serves(self) -> None:
        """A fresh call runs once and its retry is replayed; the same for a SEP-3182 key."""
        amount = next(self.amounts)
        first, retry = f"valid-{uuid.uuid4().hex}", f"valid-{uuid.uuid4().hex}"
        await self.peer.call(first, "charge", arguments={"amount": amount})
        answer = await self.peer.response(first, timeout=60)
        await self.peer.call(retry, "charge", arguments={"amount": amount})
        replay = await self.peer.response(retry, timeout=60)
        assert unmarked(replay["result"]) == answer["result"], (answer, replay)
        assert replay["result"]["_meta"] == {REPLAYED_META_KEY: True}
        assert answer["result"]["content"][0]["text"].startswith(f"charged {amount} ")
        key = f"sep-{uuid.uuid4().hex}"
        sep_ids = [f"valid-{uuid.uuid4().hex}" for _ in range(2)]
        results = []
        for request_id in sep_ids:
            await self.peer.call(
                request_id, "charge", arguments={"amount": amount + 1}, idempotencyKey=key
            )
            results.append((await self.peer.response(request_id, timeout=60))["result"])
        assert unmarked(results[1]) == results[0]
        ran = [e for e in executions(self.counter) if _amount(e) in (amount, amount + 1)]
        assert len(ran) == 2, ran

    def check_stdout(self) -> None:
        for line in self.peer.lines:
            strict_json_rpc(line)


def _amount(execution: dict[str, Any]) -> object:
    arguments = execution.get("arguments")
    return arguments.get("amount") if isinstance(arguments, dict) else None


# Every fixture variant of every registered engine: variant id -> fresh-store-URL fixture.
STORE_URL_FIXTURES = {variant.id: variant.fixture for variant in fixture_variants()}


@pytest.fixture(params=sorted(STORE_URL_FIXTURES))
async def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Proxy]:
    """``idemstore proxy --store URL -- mock_server`` on a fresh store of each backend."""
    url = request.getfixturevalue(STORE_URL_FIXTURES[request.param])
    counter = tmp_path / "executions.jsonl"
    command = proxy_command("--store", url, server=mock_command("--counter", str(counter)))
    # The environment as it is now: the DynamoDB fixture has set dummy AWS credentials.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp_path / "proxy.stderr").open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
            limit=64 * 1024 * 1024,
        )
    peer = RawPeer(process)
    try:
        await peer.initialize()
        served = Proxy(peer, counter)
        yield served
        # For the fault table (pytest --junitxml shows it): lines this one proxy survived.
        request.node.user_properties.append(("malformed_lines_sent", served.lines_sent))
        # Close stdin as a host does: the proxy answers what is pending and exits cleanly;
        # whatever it still writes must be JSON-RPC too.
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(ConnectionError):
            process.stdin.close()
        rest = await asyncio.wait_for(process.stdout.read(), 60)
        for line in rest.splitlines(keepends=True):
            strict_json_rpc(line)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        await peer.kill()


def _call(request_id: object, params: object) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
    if params is not ...:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def fixed_corpus() -> list[bytes]:
    charge = {"name": "charge", "arguments": {"amount": 1}}
    corpus = [
        b"this is not json\n",
        b"\xff\xfe\xc3\x28 invalid utf-8\n",
        b"\n",
        b"   \n",
        b"\r\n",
        b"{\n",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge"\n',
        # JSON of the wrong types
        b"42\n",
        b'"a string"\n',
        b"null\n",
        b"true\n",
        b"[]\n",
        b"[1,2,3]\n",
        b"{}\n",
        b'{"jsonrpc":"2.0"}\n',
        b'{"jsonrpc":"1.0","id":"w1","method":"ping"}\n',
        b'{"id":"w2","method":42}\n',
        # requests without ids, and notifications
        b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"charge",'
        b'"arguments":{"amount":1}}}\n',
        b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"charge","arguments":{}}}\n',
        b'{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"echo"}}\n',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"none"}}\n',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":[1]}\n',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled"}\n',
        # tools/call params of the wrong types
        _call("p1", ...),
        _call("p2", None),
        _call("p3", []),
        _call("p4", "charge"),
        _call("p5", 7),
        _call("p6", {"name": 7, "arguments": {}}),
        _call("p7", {"name": None}),
        _call("p8", {"arguments": {"amount": 1}}),
        _call("p9", {"name": ["charge"], "idempotencyKey": "k-p9"}),
        # arguments that are not an object
        _call("a1", {"name": "charge", "arguments": [1, 2]}),
        _call("a2", {"name": "charge", "arguments": "amount=1"}),
        _call("a3", {"name": "charge", "arguments": 1}),
        _call("a4", {"name": "charge", "arguments": [1], "idempotencyKey": "k-a4"}),
        _call("a5", {"name": "charge", "arguments": "x", "_meta": {"idempotency-key": "k-a5"}}),
        # keys of the wrong types and shapes
        _call("k1", {**charge, "idempotencyKey": 17}),
        _call("k2", {**charge, "idempotencyKey": None}),
        _call("k3", {**charge, "idempotencyKey": ["k"]}),
        _call("k4", {**charge, "idempotencyKey": {"k": 1}}),
        _call("k5", {**charge, "idempotencyKey": ""}),
        _call("k6", {**charge, "idempotencyKey": "x" * 100_000}),
        _call("k7", {**charge, "idempotencyKey": "a\x00b"}),
        _call("k8", {**charge, "idempotencyKey": "a\ud800b"}),
        _call("k9", {**charge, "idempotencyKey": "'; DROP TABLE idemstore_records; --"}),
        _call("k10", {**charge, "_meta": "not an object"}),
        _call("k11", {**charge, "_meta": {"idempotency-key": 3.5}}),
        _call("k12", {**charge, "_meta": {"idempotency-key": "]]"}}),
        # arguments the hasher refuses, and odd ids
        _call("h1", {"name": "charge", "arguments": {"x": "\udfff"}}),
        _call("h2", {"name": "charge", "arguments": {"x": "\udfff"}, "idempotencyKey": "k-h2"}),
        _call("h3", {"name": "charge", "arguments": json.loads("[" * 900 + "]" * 900)}),
        b'{"jsonrpc":"2.0","id":"h4","method":"tools/call","params":{"name":"charge",'
        b'"arguments":{"amount":NaN},"idempotencyKey":"k-h4"}}\n',
        b'{"jsonrpc":"2.0","id":"h5","method":"tools/call","params":{"name":"charge",'
        b'"arguments":{"amount":1e400}}}\n',
        _call(["odd", "id"], {**charge, "idempotencyKey": 1}),
        _call({"odd": "id"}, {**charge, "idempotencyKey": 1}),
        _call(2**70, {**charge, "idempotencyKey": 1}),
        _call(1.5, {**charge, "idempotencyKey": 1}),
        _call(True, {**charge, "idempotencyKey": 1}),
        # Non-finite ids the proxy itself must answer (the mock would echo them as NaN).
        b'{"jsonrpc":"2.0","id":NaN,"method":"tools/call","params":{"name":"charge",'
        b'"arguments":{},"idempotencyKey":5}}\n',
        b'{"jsonrpc":"2.0","id":Infinity,"method":"tools/call","params":{"name":"charge",'
        b'"arguments":[],"idempotencyKey":"k"}}\n',
        b'{"jsonrpc":"2.0","id":1e400,"method":"tools/call","params":{"name":"charge",'
        b'"arguments":{},"idempotencyKey":""}}\n',
        # One id used twice while the first call may still be pending.
        _call("twice", {"name": "charge", "arguments": {"amount": 2}, "idempotencyKey": "k-2"}),
        _call("twice", {"name": "charge", "arguments": {"amount": 2}, "idempotencyKey": "k-2"}),
        # 10 MB lines: garbage, and a valid call whose result is 10 MB (replayed below).
        b"x" * TEN_MB + b"\n",
        _call("big-1", {"name": "echo", "arguments": {"text": "y" * TEN_MB}}),
        _call("big-2", {"name": "echo", "arguments": {"text": "y" * TEN_MB}}),
    ]
    return corpus


async def test_the_fixed_corpus_of_malformed_lines(proxy: Proxy) -> None:
    corpus = fixed_corpus()
    await proxy.send_lines(corpus)
    big = [await proxy.peer.response(f"big-{n}", timeout=120) for n in (1, 2)]
    assert unmarked(big[1]["result"]) == big[0]["result"]
    assert big[0]["result"]["content"][0]["text"] == "y" * TEN_MB
    await proxy.still_serves()
    # Every request the proxy answers itself was answered, with its own id where it can be
    # written as JSON and null where it cannot.
    # "k2" (a null key) reads as no key (SEP-3182 makes the field optional): it runs.
    for request_id in ["k1", "k3", "k4", "k5", "k6", "k7", "k8", "a4", "a5", "h2", "h4"]:
        error = (await proxy.peer.response(request_id))["error"]
        assert error["data"]["type"] == "idempotency_key_invalid", (request_id, error)
    proxy.check_stdout()


# -- random lines ---------------------------------------------------------------------------

_text = st.text(max_size=8)
_field = _text.filter(lambda k: k != "seconds")  # the mock sleeps that long
_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        _text,
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(_field, children, max_size=3)
    ),
    max_leaves=8,
)
_id = st.one_of(
    st.integers(-(2**63), 2**63),
    _text,
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
)
_tool = st.one_of(
    st.sampled_from(["charge", "echo", "fail", "tool_error", "ask", "nope", ""]), _text
).filter(lambda name: name != "crash")  # the mock exits on purpose
_key = st.one_of(st.text(max_size=300), _json)
_call_params = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"name": st.one_of(_tool, _json)},
        optional={
            "arguments": _json,
            "idempotencyKey": _key,
            "_meta": st.one_of(_json, st.fixed_dictionaries({"idempotency-key": _key})),
            "requestState": _json,
        },
    ),
)
_tools_call = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2]), "method": st.just("tools/call")},
    optional={"id": _id, "params": _call_params},
)
_other = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "method": st.sampled_from(
            ["ping", "tools/list", "nope/x", "notifications/initialized", "notifications/cancelled"]
        ),
    },
    # Only object params: the mock server crashes on others for these methods.
    optional={"id": _id, "params": st.dictionaries(_field, _json, max_size=3)},
)
_cancel = st.builds(
    lambda request_id: {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id},
    },
    _id,
)
_response = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "id": _id}, optional={"result": _json, "error": _json}
)
_json_line = st.one_of(_tools_call, _tools_call, _other, _cancel, _response, _json).map(
    lambda value: json.dumps(value).encode() + b"\n"
)
# Not JSON: any bytes (a newline inside just makes more lines), or a JSON line cut short.
_raw_line = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32).map(lambda t: t.encode("utf-8", "surrogatepass")),
    _json_line.map(lambda line: line[: len(line) // 2]),
).map(lambda data: data.rstrip(b"\n") + b"\n")
line_batch = st.lists(st.one_of(_json_line, _json_line, _raw_line), min_size=5, max_size=40)


@settings(OVER_ONE_FIXTURE, max_examples=25)
@given(lines=line_batch)
async def test_random_lines_never_stop_the_proxy(proxy: Proxy, lines: list[bytes]) -> None:
    # One proxy process serves every example: it must still be serving after all of them.
    await proxy.send_lines(lines)
    event(f"{len(lines) // 10 * 10}+ lines per batch")
    await proxy.still_serves()
    proxy.check_stdout()
