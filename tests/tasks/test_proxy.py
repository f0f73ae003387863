"""``idemstore proxy`` and SEP-2663 tasks: a retried task-augmented call gets the same task.

The proxy records the server's bytes, so the handle of the task the first call started is
what every retry under the same key (SEP-3182, ``_meta`` or derived) gets; ``tasks/get``
carries no key and passes through.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from fastmcp_tasks.client_models import GetTaskRequest, GetTaskRequestParams

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.conftest import ROOT
from tests.tasks.task_servers import OPT_IN, RAW, runs_logged, task_call

if TYPE_CHECKING:
    from pathlib import Path


async def test_retried_task_calls_through_the_proxy_get_the_same_task(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    server = [sys.executable, str(ROOT / "tests" / "tasks" / "task_servers.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TASKS_RUN_LOG": str(log)}
    command = [sys.executable, "-m", "idemstore", "proxy", "--", *server]
    # FastMCP's client: it declares the tasks extension in each request's _meta (the SDK's
    # client writes its own capabilities there, without it, and the call would run inline).
    async with Client(StdioTransport(command[0], command[1:], env=env)) as client:
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
