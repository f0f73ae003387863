"""What the tasks lane's tests share: a FastMCP server with SEP-2663 tasks, keyed calls.

The lane runs in its own environment (noxfile.py, ``tasks``): fastmcp-tasks pins an older
fastmcp-slim than the adapters' FastMCP, so it is installed there alone, without its pins.
Run as a script, the server serves stdio; ``--http PORT`` serves Streamable HTTP on loopback.
Each execution of ``crunch`` appends a line to the file named by ``$TASKS_RUN_LOG``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension
from mcp_types import CallToolRequestParams, Request
from pydantic import TypeAdapter

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastmcp import Client

TASKS = "io.modelcontextprotocol/tasks"
# SEP-2133: a client opts in to an extension per request, in the request's _meta.
OPT_IN: dict[str, Any] = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}}
RAW = TypeAdapter(dict[str, Any])


class KeyedParams(CallToolRequestParams):
    """``tools/call`` params with SEP-3182's ``idempotencyKey``."""

    idempotency_key: str | None = None


class KeyedCall(Request[KeyedParams, Literal["tools/call"]]):
    method: Literal["tools/call"] = "tools/call"


async def task_call(client: Client, key: str | None, n: int) -> dict[str, Any]:
    """A task-augmented ``crunch(n)`` (with a SEP-3182 key, or none): the raw answer."""
    params = KeyedParams(name="crunch", arguments={"n": n}, idempotency_key=key, _meta=OPT_IN)
    return await client.session.send_request(KeyedCall(params=params), RAW)


async def runs_logged(log: Path, count: int, timeout: float = 20.0) -> list[str]:
    """The runs ``log`` holds once it holds ``count`` (tasks run in the server's background,
    after their handles were answered), and half a second more for any extra run to show."""
    for _ in range(int(timeout / 0.05)):
        if len(_runs(log)) >= count:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    return sorted(_runs(log))


def _runs(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _log_run(n: int) -> None:
    with Path(os.environ["TASKS_RUN_LOG"]).open("a") as f:
        f.write(f"{n}\n")


def tasks_server(on_run: Callable[[int], None] = _log_run) -> FastMCP[Any]:
    """A FastMCP server whose ``crunch`` tool runs as a task when the client opts in;
    ``on_run(n)`` is told of each execution (by default, a line in ``$TASKS_RUN_LOG``)."""
    mcp: FastMCP[Any] = FastMCP("tasks-test")
    mcp.add_extension(TasksExtension(url="memory://"))

    @mcp.tool(task=True)
    async def crunch(n: int) -> str:
        on_run(n)
        return f"crunched {n}"

    return mcp


if __name__ == "__main__":
    server = tasks_server()
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
    else:
        server.run("stdio", show_banner=False)
