"""A minimal MCP endpoint over HTTP for the ``gateway`` scenario: one tool, counted executions.

JSON-RPC 2.0 POSTed to ``/mcp``, answered with ``application/json`` (the Streamable HTTP
transport allows either JSON or an event stream; JSON keeps the upstream's own cost small, so
the gateway's share of the latency is what shows). Every ``tools/call`` appends one line to
``--counter`` before answering. Run it with
``python -m idemstore.bench.mock_http_server --port N --counter FILE`` (loopback only).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from idemstore.bench.loopback_app import serve_on_loopback

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["main"]


def _app(counter_path: str) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    counter = open(counter_path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the app
    executions = 0

    async def mcp(request: Request) -> Response:
        nonlocal executions
        message = json.loads(await request.body())
        if "id" not in message:
            return Response(status_code=202)  # a notification
        method = message.get("method")
        result: dict[str, Any]
        if method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "idemstore-bench-http", "version": "1"},
            }
        elif method == "ping":  # the gateway's check before a replay
            result = {}
        elif method == "tools/call":
            executions += 1
            counter.write(f"{executions}\n")
            counter.flush()
            text = f"execution {executions}"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            error = {"code": -32601, "message": f"no method {method!r}"}
            return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error})
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    return Starlette(routes=[Route("/mcp", mcp, methods=["POST"])])


def main(argv: list[str] | None = None) -> int:
    return serve_on_loopback(argv, _app, "--counter", "file that gets a line per execution")


if __name__ == "__main__":
    raise SystemExit(main())
