"""The examples in docs/mcp-server.md, run as written, each against a shared store.

Issue 14, case 5: with a shared store and no ``scope=``, a retry that lands on the other
replica must replay, not run the tool a second time.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import ROOT
from tests.mcp_server.conftest import call, unmarked

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def documented_example(name: str) -> str:
    """The code block after ``<!-- example: NAME -->`` in docs/mcp-server.md."""
    marker = f"<!-- example: {name} -->"
    text = (ROOT / "docs" / "mcp-server.md").read_text()
    found = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.DOTALL)
    assert found, f"no {marker} code block in docs/mcp-server.md"
    return found.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def replicas(tmp_path: Path, sqlite_file_store_url: str) -> Iterator[list[str]]:
    """Two processes of the documented server on one store; their URLs."""
    script = tmp_path / "server.py"
    script.write_text(documented_example("fastmcp-replicas"))
    processes, urls = [], []
    for _ in range(2):
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "IDEMSTORE_URL": sqlite_file_store_url}
        env["PORT"] = str(port)
        processes.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        urls.append(f"http://127.0.0.1:{port}/mcp")
    try:
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)


async def _connectable(url: str) -> None:
    port = int(url.split(":")[2].split("/")[0])
    for _ in range(300):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise AssertionError(f"{url} never listened")


@pytest.mark.slow
async def test_documented_replicas_without_scope_run_a_key_once(
    replicas: list[str], tmp_path: Path
) -> None:
    for url in replicas:
        await _connectable(url)
    async with Client(replicas[0]) as one:
        first = await call(one, "charge", {"amount": 5, "currency": "eur"}, key="order-9")
    async with Client(replicas[1]) as two:
        retry = await call(two, "charge", {"amount": 5, "currency": "eur"}, key="order-9")
    assert isinstance(first, dict) and unmarked(retry) == first
    assert (tmp_path / "ledger.txt").read_text() == "5 eur\n"


@pytest.mark.slow
async def test_documented_lowlevel_server_replays_after_a_restart(
    tmp_path: Path, sqlite_file_store_url: str
) -> None:
    script = tmp_path / "server.py"
    script.write_text(documented_example("lowlevel-stdio"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IDEMSTORE_URL": sqlite_file_store_url}
    params = StdioServerParameters(
        command=sys.executable, args=[str(script)], env=env, cwd=tmp_path
    )
    outcomes = []
    for _ in range(2):  # the second process is the server after a restart
        async with Client(params) as client:
            outcomes.append(await call(client, "charge", {"amount": 5}, key="order-7"))
    assert isinstance(outcomes[0], dict) and unmarked(outcomes[1]) == outcomes[0]
    assert (tmp_path / "ledger.txt").read_text() == "5\n"
