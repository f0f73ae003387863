"""``idemstore gateway`` and SEP-2663 tasks: a retried task-augmented call gets the same task.

The upstream is a FastMCP server with the tasks extension on Streamable HTTP; the client is
FastMCP's (2026-07-28, no session), which declares the extension in each request's ``_meta``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp_tasks.client_models import GetTaskRequest, GetTaskRequestParams

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.conftest import ROOT
from tests.gateway.processes import free_port, start_gateway
from tests.gateway.rpc import CALLER
from tests.loopback_process import Child
from tests.tasks.task_servers import OPT_IN, RAW, runs_logged, task_call

if TYPE_CHECKING:
    from pathlib import Path


async def test_retried_task_calls_through_the_gateway_get_the_same_task(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    port = free_port()
    server = [sys.executable, str(ROOT / "tests" / "tasks" / "task_servers.py"), "--http"]
    upstream = Child(
        [*server, str(port)], port, tmp_path / "upstream.out", env={"TASKS_RUN_LOG": str(log)}
    ).start()
    gateway = start_gateway(tmp_path, f"http://127.0.0.1:{port}/mcp", "memory://")
    try:
        url = f"http://127.0.0.1:{gateway.port}/mcp"
        async with Client(StreamableHttpTransport(url, headers=CALLER)) as client:
            derived = [await task_call(client, None, 1) for _ in range(2)]
            keyed = [await task_call(client, "order-9", 2) for _ in range(2)]
            for first, retry in (derived, keyed):
                assert first["resultType"] == retry["resultType"] == "task"
                assert retry["taskId"] == first["taskId"]
                assert retry["_meta"][REPLAYED_META_KEY] is True
            get = GetTaskRequestParams(task_id=keyed[0]["taskId"], _meta=OPT_IN)
            got = await client.session.send_request(GetTaskRequest(params=get), RAW)
            assert got["taskId"] == keyed[0]["taskId"]
            assert REPLAYED_META_KEY not in got.get("_meta", {})
            assert await runs_logged(log, 2) == ["1", "2"]  # one task per key
    finally:
        gateway.stop()
        upstream.stop()
