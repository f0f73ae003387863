"""A minimal MCP server on stdio for the ``proxy`` scenario: one tool with a side-effect counter.

Newline-delimited JSON-RPC 2.0 on stdin/stdout. Every ``tools/call`` appends one line to the
``--counter`` file before answering, so the bench counts real executions from outside, whether
the server was called directly or through the proxy. Run it with
``python -m idemstore.bench.mock_server --counter FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["main"]

TOOL = {
    "name": "record",
    "description": "Records one execution (the side effect the proxy must not repeat).",
    "inputSchema": {"type": "object", "additionalProperties": True},
}


def _answer(request_id: Any, result: Any = None, error: dict[str, Any] | None = None) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if error is not None:
        message["error"] = error
    else:
        message["result"] = result
    return json.dumps(message, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idemstore.bench.mock_server")
    parser.add_argument("--counter", required=True, help="file that gets a line per execution")
    args = parser.parse_args(argv)
    executions = 0
    with open(args.counter, "a", encoding="utf-8") as counter:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                print(_answer(None, error={"code": -32700, "message": "parse error"}), flush=True)
                continue
            if not isinstance(message, dict) or "id" not in message:
                continue  # a notification (initialized, cancelled): nothing to answer
            method = message.get("method")
            params = message.get("params") or {}
            if method == "initialize":
                reply = _answer(
                    message["id"],
                    {
                        "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "idemstore-bench-mock", "version": "1"},
                    },
                )
            elif method == "tools/list":
                reply = _answer(message["id"], {"tools": [TOOL]})
            elif method == "tools/call":
                executions += 1
                # Written and flushed before the answer: a reply means the side effect happened.
                counter.write(f"{executions}\n")
                counter.flush()
                text = f"execution {executions}"
                reply = _answer(
                    message["id"], {"content": [{"type": "text", "text": text}], "isError": False}
                )
            elif method == "ping":
                reply = _answer(message["id"], {})
            else:
                reply = _answer(
                    message["id"], error={"code": -32601, "message": f"no method {method!r}"}
                )
            print(reply, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
