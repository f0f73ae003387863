"""A mock MCP server over stdio (stdlib only) whose tool executions can be counted.

It speaks both eras: the ``initialize`` handshake and the stateless ``server/discover``.
Every execution of a tool appends one JSON line to ``--counter FILE`` (O_APPEND, so several
server processes can share one file). Tools:

- ``charge {amount}``: the side effect.
- ``echo {text}``: answers with the text (for large messages).
- ``fail {}``: answers with a JSON-RPC error.
- ``tool_error {}``: answers with a result whose ``isError`` is true.
- ``crash {}``: exits the process with status 3 before answering.
- ``ask {}``: an MRTR tool: ``input_required`` first, a result once ``inputResponses`` come.
- ``exact {}``: answers with ``EXACT_RESULT``, bytes ``json.dumps`` cannot write (``1e400``,
  ``1.0``, ``-0.0``, a ``\\u00e9`` escape), its ``jsonrpc`` and ``id`` members last.
- ``cancelled {}``: answers ``-32800 Request cancelled``, as the SDK does for a cancelled call.

Every tool but ``crash`` answers ``arguments.seconds`` (default 0) after it executed.

Options: ``--drop-first N`` executes the first N tool calls but never answers them (a dropped
response); ``--hold-first SECONDS`` holds the first call's answer back that long (a response the
client gives up waiting for); ``--strict`` rejects ``tools/call`` params it does not know (such
as ``idempotencyKey``); ``--log FILE`` appends every line received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

MODERN = "2026-07-28"
HANDSHAKE = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
KNOWN_CALL_PARAMS = {"name", "arguments", "_meta", "requestState", "inputResponses", "task"}

TOOLS = [
    {
        "name": "charge",
        "description": "Charge an amount (a side effect).",
        "inputSchema": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "seconds": {"type": "number"}},
            "required": ["amount"],
        },
    },
    {
        "name": "echo",
        "description": "Answer with the text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {"name": "fail", "description": "A JSON-RPC error.", "inputSchema": {"type": "object"}},
    {"name": "tool_error", "description": "isError result.", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "Exit mid-call.", "inputSchema": {"type": "object"}},
    {"name": "ask", "description": "Needs input (MRTR).", "inputSchema": {"type": "object"}},
    {"name": "exact", "description": "Odd but valid bytes.", "inputSchema": {"type": "object"}},
    {"name": "cancelled", "description": "-32800.", "inputSchema": {"type": "object"}},
]

EXACT_RESULT = (
    b'{ "content":[{"type":"text","text":"caf\\u00e9"}],'
    b'"structuredContent":{"big":1e400,"one":1.0,"zero":-0.0},"isError":false }'
)


class MockServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.calls = 0
        self.executions = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.log = open(args.log, "ab") if args.log else None  # noqa: SIM115

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
        sys.stdout.buffer.flush()

    def count(self, name: str, arguments: object) -> int:
        self.executions += 1
        if self.args.counter:
            line = json.dumps({"tool": name, "arguments": arguments, "pid": os.getpid()})
            fd = os.open(self.args.counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode() + b"\n")
            finally:
                os.close(fd)
        return self.executions

    @staticmethod
    def modern(params: dict[str, Any]) -> bool:
        meta = params.get("_meta")
        return isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta

    def result(self, params: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        if self.modern(params):
            body = {"resultType": "complete", **body}
        return body

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if request_id is None:
            return  # notifications: nothing to do
        capabilities = {"tools": {"listChanged": False}}
        server_info = {"name": "mock", "version": "1.0"}
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in HANDSHAKE else HANDSHAKE[0]
            result = {
                "protocolVersion": version,
                "capabilities": capabilities,
                "serverInfo": server_info,
            }
            self.send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "server/discover":
            result = {
                "supportedVersions": [MODERN],
                "capabilities": capabilities,
                "resultType": "complete",
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": server_info},
            }
            self.send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/list":
            body: dict[str, Any] = {"tools": TOOLS}
            if self.modern(params):
                body.update(ttlMs=0, cacheScope="private")
            self.send({"jsonrpc": "2.0", "id": request_id, "result": self.result(params, body)})
        elif method == "ping":
            self.send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method == "tools/call":
            task = asyncio.create_task(self.call(request_id, params))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
            self.send({"jsonrpc": "2.0", "id": request_id, "error": error})

    async def call(self, request_id: object, params: dict[str, Any]) -> None:
        unknown = set(params) - KNOWN_CALL_PARAMS
        if self.args.strict and unknown:
            error = {"code": -32602, "message": f"unknown params: {sorted(unknown)}"}
            self.send({"jsonrpc": "2.0", "id": request_id, "error": error})
            return
        name = params.get("name")
        arguments = params.get("arguments") or {}
        self.calls += 1
        ordinal = self.calls
        if name == "ask" and "inputResponses" not in params:
            body = {
                "resultType": "input_required",
                "inputRequests": {
                    "q": {"method": "elicitation/create", "params": {"message": "sure?"}}
                },
                "requestState": "state-1",
            }
            self.send({"jsonrpc": "2.0", "id": request_id, "result": body})
            return
        execution = self.count(name, arguments)
        if name == "crash":
            os._exit(3)
        await asyncio.sleep(float(arguments.get("seconds", 0)))
        if ordinal <= self.args.drop_first:
            return
        if ordinal == 1 and self.args.hold_first:
            await asyncio.sleep(self.args.hold_first)
        if name == "exact":
            head = b'{"result": ' + EXACT_RESULT + b', "jsonrpc":"2.0","id":'
            sys.stdout.buffer.write(head + json.dumps(request_id).encode() + b"}\n")
            sys.stdout.buffer.flush()
            return
        if name == "cancelled":
            error = {"code": -32800, "message": "Request cancelled"}
            self.send({"jsonrpc": "2.0", "id": request_id, "error": error})
            return
        if name == "fail":
            error = {"code": -32001, "message": f"the tool failed (execution {execution})"}
            self.send({"jsonrpc": "2.0", "id": request_id, "error": error})
            return
        if name == "echo":
            text = str(arguments.get("text", ""))
        elif name == "charge":
            text = f"charged {arguments.get('amount')} (execution {execution})"
        else:
            text = f"{name} (execution {execution})"
        body = {"content": [{"type": "text", "text": text}], "isError": name == "tool_error"}
        self.send({"jsonrpc": "2.0", "id": request_id, "result": self.result(params, body)})

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=256 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        log = self.log
        while True:
            line = await reader.readline()
            if not line:
                break
            if log is not None:
                log.write(line)
                log.flush()
            try:
                message = json.loads(line)
            except ValueError:
                error = {"code": -32700, "message": "parse error"}
                self.send({"jsonrpc": "2.0", "id": None, "error": error})
                continue
            if isinstance(message, dict):
                self.handle(message)
            else:
                error = {"code": -32600, "message": "batches are not supported"}
                self.send({"jsonrpc": "2.0", "id": None, "error": error})
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counter")
    parser.add_argument("--log")
    parser.add_argument("--drop-first", type=int, default=0)
    parser.add_argument("--hold-first", type=float, default=0.0)
    parser.add_argument("--strict", action="store_true")
    asyncio.run(MockServer(parser.parse_args()).serve())


if __name__ == "__main__":
    main()
