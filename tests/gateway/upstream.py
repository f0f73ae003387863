"""An upstream FastMCP server over Streamable HTTP, run as a subprocess by the gateway tests.

``python -m tests.gateway.upstream --port N --log FILE [--stateless] [--json]``

Every tool execution appends one line (the tool's name) to ``--log``, so a test counts
executions across processes. Besides the FastMCP tools, an ASGI wrapper plays the upstream
failures a gateway meets: a ``tools/call`` of ``http_500`` executes (logs) and answers 500;
``cut_stream`` executes, sends one progress event and drops the connection before its result;
``exact`` executes and answers ``EXACT_RESULT`` (bytes ``json.dumps`` cannot write), as one
event or, with ``{"json": true}``, as a JSON body; ``cancelled`` executes and answers
``-32800 Request cancelled``, as the SDK's 2025-era transport does for a cancelled call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import uvicorn
from fastmcp import Context, FastMCP

LOG: Path

EXACT_RESULT = (
    b'{ "content":[{"type":"text","text":"caf\\u00e9"}],'
    b'"structuredContent":{"big":1e400,"one":1.0,"zero":-0.0},"isError":false }'
)


def executed(name: str) -> None:
    with LOG.open("a") as log:
        log.write(f"{name}\n")


def build() -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("gateway-upstream")

    @mcp.tool
    async def record(n: int = 0, note: str = "") -> str:
        """Append to the execution log."""
        executed("record")
        return f"recorded {n} {note}".strip()

    @mcp.tool
    async def slow(n: int = 0, seconds: float = 1.0) -> str:
        """Log, then sleep, then answer."""
        executed("slow")
        await asyncio.sleep(seconds)
        return f"slow {n} done"

    @mcp.tool
    async def progress(n: int = 0, ctx: Context | None = None) -> str:
        """Report progress twice before answering (several events on one stream)."""
        executed("progress")
        if ctx is not None:
            await ctx.report_progress(1, 2)
            await ctx.report_progress(2, 2)
        return f"progress {n} done"

    @mcp.tool(annotations={"readOnlyHint": True})
    async def look(n: int = 0) -> str:
        """A read-only tool."""
        executed("look")
        return f"looked {n}"

    @mcp.tool
    async def headers() -> dict[str, str]:
        """The request headers this call reached the upstream with (not an execution)."""
        from fastmcp.server.dependencies import get_http_headers

        return get_http_headers(include_all=True)

    return mcp


def _tools_call(body: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") == "tools/call":
        params = message.get("params")
        if isinstance(params, dict) and isinstance(params.get("name"), str):
            return message
    return None


async def _answer_raw(send: Any, message: dict[str, Any]) -> None:
    """``exact`` and ``cancelled``: the final response written byte by byte, not by FastMCP."""
    name = message["params"]["name"]
    executed(name)
    request_id = json.dumps(message["id"]).encode()
    if name == "exact":
        data = b'{"result": ' + EXACT_RESULT + b', "jsonrpc":"2.0","id":' + request_id + b"}"
    else:
        error = b'{"code":-32800,"message":"Request cancelled"}'
        data = b'{"jsonrpc":"2.0","id":' + request_id + b',"error":' + error + b"}"
    arguments = message["params"].get("arguments") or {}
    if arguments.get("json"):
        headers = [(b"content-type", b"application/json")]
    else:
        headers = [(b"content-type", b"text/event-stream")]
        data = b"event: message\ndata: " + data + b"\n\n"
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Failures:
    """ASGI wrapper: the failing and byte-exact tools, answered before FastMCP sees them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        tools_call = _tools_call(body)
        name = tools_call["params"]["name"] if tools_call is not None else None
        if tools_call is not None and name in ("exact", "cancelled"):
            await _answer_raw(send, tools_call)
            return
        if name == "http_500":
            executed(name)
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"upstream exploded"})
            return
        if name == "cut_stream":
            executed(name)
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            event = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
            data = b"event: message\ndata: " + json.dumps(event).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
            raise RuntimeError("cut the stream")  # uvicorn drops the connection

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                message: dict[str, Any] = await receive()
                return message
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def main() -> None:
    global LOG
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--json", action="store_true", help="JSON answers instead of SSE")
    args = parser.parse_args()
    LOG = args.log
    app = build().http_app(path="/mcp", stateless_http=args.stateless, json_response=args.json)
    config = uvicorn.Config(
        Failures(app), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on"
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
