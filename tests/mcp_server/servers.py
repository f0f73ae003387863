"""The same small tool set served through each adapter: low-level ``Server`` and FastMCP.

Every tool appends to ``Tools.calls`` (and to ``log_path``, when given, so executions in
other processes can be counted), so a test sees exactly how often a tool body ran.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools.base import ToolResult
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from idemstore import open_store
from idemstore.mcp.server import FastMCPIdempotency, ServerIdempotency

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore

ADAPTERS = ("lowlevel", "fastmcp")

TOOL_NAMES = ("charge", "fail_result", "explode", "reject", "slow", "ask", "relay_cancelled")


class Tools:
    """Tool bodies shared by both adapters, and the record of their executions."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.log_path = log_path
        self.started = anyio.Event()
        self.gate = anyio.Event()
        self.interrupted = anyio.Event()  # a slow call was cancelled while it waited

    def ran(self, name: str, arguments: dict[str, Any]) -> int:
        self.calls.append((name, arguments))
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(f"{name}\n")
        return len(self.calls)

    def count(self, name: str) -> int:
        return sum(1 for called, _ in self.calls if called == name)

    async def charge(self, amount: float) -> str:
        n = self.ran("charge", {"amount": amount})
        return f"charged {amount} (execution {n})"

    async def slow(self, amount: float, seconds: float = 0.0) -> str:
        n = self.ran("slow", {"amount": amount})
        self.started.set()
        try:
            if seconds:
                await anyio.sleep(seconds)
            else:
                await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.interrupted.set()
            raise
        return f"slow {amount} (execution {n})"


def lowlevel_server(tools: Tools, store: IdempotencyStore, **options: Any) -> Server[Any]:
    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {"type": "object"}
        return types.ListToolsResult(
            tools=[types.Tool(name=name, input_schema=schema) for name in TOOL_NAMES]
        )

    async def call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        args = params.arguments or {}
        name = params.name
        if name == "charge":
            text = await tools.charge(args.get("amount", 0))
        elif name == "slow":
            text = await tools.slow(args.get("amount", 0), args.get("seconds", 0.0))
        elif name == "fail_result":
            n = tools.ran(name, args)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"card declined (execution {n})")],
                is_error=True,
            )
        elif name == "explode":
            n = tools.ran(name, args)
            raise RuntimeError(f"tool exploded (execution {n})")
        elif name == "reject":
            n = tools.ran(name, args)
            raise MCPError(code=-32050, message=f"rejected (execution {n})", data={"n": n})
        elif name == "relay_cancelled":
            # A tool relaying to another server whose call was cancelled: its -32800, as is.
            tools.ran(name, args)
            raise MCPError(code=-32800, message="Request cancelled")
        elif name == "ask":
            tools.ran(name, args)
            if params.request_state is None:
                return types.InputRequiredResult(request_state="asked")
            text = f"answered {params.request_state}"
        else:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {name}")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server: Server[Any] = Server("lowlevel-test", on_list_tools=list_tools, on_call_tool=call_tool)
    server.middleware.append(ServerIdempotency(store, **options))
    return server


def fastmcp_server(tools: Tools, store: IdempotencyStore, **options: Any) -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("fastmcp-test")

    @mcp.tool
    async def charge(amount: float = 0, note: str = "", meta: dict[str, Any] | None = None) -> str:
        return await tools.charge(amount)

    @mcp.tool
    async def slow(amount: float = 0, seconds: float = 0.0) -> str:
        return await tools.slow(amount, seconds)

    @mcp.tool
    async def fail_result() -> ToolResult:
        n = tools.ran("fail_result", {})
        return ToolResult(content=f"card declined (execution {n})", is_error=True)

    @mcp.tool
    async def explode() -> str:
        n = tools.ran("explode", {})
        raise ToolError(f"tool exploded (execution {n})")

    @mcp.tool
    async def reject() -> str:
        n = tools.ran("reject", {})
        raise RuntimeError(f"rejected (execution {n})")

    @mcp.tool
    async def ask() -> Any:
        tools.ran("ask", {})
        from fastmcp.server.dependencies import get_context

        state = get_context().request_state
        if state is None:
            return types.InputRequiredResult(request_state="asked")
        return f"answered {state}"

    mcp.add_middleware(FastMCPIdempotency(store, **options))
    return mcp


def build(adapter: str, tools: Tools, store: IdempotencyStore, **options: Any) -> Server[Any]:
    """The low-level ``Server`` to connect a client to, for either adapter."""
    if adapter == "lowlevel":
        return lowlevel_server(tools, store, **options)
    return fastmcp_server(tools, store, **options)._mcp_server


async def _serve_stdio(adapter: str, url: str, log: Path, scope: str | None) -> None:
    from mcp.server.stdio import stdio_server

    async with open_store(url) as store:
        tools = Tools(log)
        if adapter == "fastmcp":
            await fastmcp_server(tools, store, scope=scope).run_stdio_async(show_banner=False)
            return
        server = lowlevel_server(tools, store, scope=scope)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def main() -> None:
    """Serve the tools over stdio: ``python -m tests.mcp_server.servers ADAPTER URL LOG``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("adapter", choices=ADAPTERS)
    parser.add_argument("store_url")
    parser.add_argument("log", type=Path)
    parser.add_argument("--scope", default=None)
    args = parser.parse_args()
    asyncio.run(_serve_stdio(args.adapter, args.store_url, args.log, args.scope))


if __name__ == "__main__":
    main()
