"""The server adapters and SEP-2663 tasks: a retried task-augmented call gets the same task.

Without idemstore, a retry of a ``tools/call`` whose task handle was lost starts a second
task. Under a SEP-3182 key the handle is recorded like any outcome and replayed, marked.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
from fastmcp import Client as FastMCPClient
from fastmcp_tasks import wire_production
from fastmcp_tasks.client_models import GetTaskRequest, GetTaskRequestParams
from mcp import Client
from mcp.server import Server

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from idemstore.mcp.server import FastMCPIdempotency, ServerIdempotency
from tests.memory_store import store as store
from tests.tasks.task_servers import OPT_IN, RAW, task_call, tasks_server

if TYPE_CHECKING:
    import mcp_types as types

    from idemstore.protocol import IdempotencyStore


def _same_handle(first: dict[str, Any], second: dict[str, Any]) -> None:
    assert first["resultType"] == second["resultType"] == "task"
    assert second["taskId"] == first["taskId"]
    assert second["_meta"][REPLAYED_META_KEY] is True
    assert REPLAYED_META_KEY not in first.get("_meta", {})


async def test_fastmcp_retried_task_call_gets_the_same_task(store: IdempotencyStore) -> None:
    runs: list[int] = []
    two_ran = anyio.Event()

    def ran(n: int) -> None:
        runs.append(n)
        if len(runs) == 2:
            two_ran.set()

    server = tasks_server(ran)
    server.add_middleware(FastMCPIdempotency(store))
    async with FastMCPClient(server) as client:
        first = await task_call(client, "order-1", 7)
        second = await task_call(client, "order-1", 7)
        _same_handle(first, second)
        other = await task_call(client, None, 7)  # no key: a task of its own
        assert other["taskId"] != first["taskId"]
        # tasks/get carries no key and passes through to the tasks extension.
        params = GetTaskRequestParams(task_id=first["taskId"], _meta=OPT_IN)
        got = await client.session.send_request(GetTaskRequest(params=params), RAW)
        assert got["taskId"] == first["taskId"]
        assert REPLAYED_META_KEY not in got.get("_meta", {})
        with anyio.fail_after(10):
            await two_ran.wait()
    assert runs == [7, 7]  # the keyed task and the unkeyed one, nothing more


def _lowlevel_task_server(store: IdempotencyStore, created: list[str]) -> Server[Any]:
    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> dict[str, Any]:
        task_id = uuid.uuid4().hex
        created.append(task_id)
        now = "2026-07-28T00:00:00Z"
        return {
            "resultType": "task",
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 60000,
            "pollIntervalMs": 1000,
        }

    server: Server[Any] = Server("lowlevel-tasks", on_call_tool=call_tool)  # type: ignore[arg-type]
    server.middleware.append(ServerIdempotency(store))
    return server


async def test_sdk_retried_task_call_gets_the_same_task(store: IdempotencyStore) -> None:
    created: list[str] = []
    # The SDK produces no task results by itself; fastmcp-tasks' serializer wrap lets a
    # low-level handler's handle through, as a tasks extension for the SDK would.
    wire_production.install()
    try:
        async with Client(_lowlevel_task_server(store, created), mode="auto") as client:
            first = await task_call(client, "order-2", 3)  # type: ignore[arg-type]
            second = await task_call(client, "order-2", 3)  # type: ignore[arg-type]
    finally:
        wire_production.uninstall()
    _same_handle(first, second)
    assert created == [first["taskId"]]
