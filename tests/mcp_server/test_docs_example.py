"""The examples in docs/mcp-server.md, run as written, each against a shared store.

Issue 14, case 5: with a shared store and no ``scope=``, a retry that lands on the other
replica must replay, not run the tool a second time.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import TYPE_CHECKING

import pytest
from mcp import Client, StdioServerParameters

from idemstore.local_servers import free_port
from tests.conftest import ROOT
from tests.loopback_process import ENV, Child
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


@pytest.fixture
def replicas(tmp_path: Path, sqlite_file_store_url: str) -> Iterator[list[str]]:
    """Two processes of the documented server on one store, listening; their URLs."""
    script = tmp_path / "server.py"
    script.write_text(documented_example("fastmcp-replicas"))
    with contextlib.ExitStack() as running:
        urls = []
        for n in range(2):
            port = free_port()
            env = {"IDEMSTORE_URL": sqlite_file_store_url, "PORT": str(port)}
            log = tmp_path / f"replica-{n}.log"
            running.enter_context(
                Child([sys.executable, str(script)], port, log, cwd=tmp_path, env=env)
            )
            urls.append(f"http://127.0.0.1:{port}/mcp")
        yield urls


@pytest.mark.slow
async def test_documented_replicas_without_scope_run_a_key_once(
    replicas: list[str], tmp_path: Path
) -> None:
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
    env = {**ENV, "IDEMSTORE_URL": sqlite_file_store_url}
    params = StdioServerParameters(
        command=sys.executable, args=[str(script)], env=env, cwd=tmp_path
    )
    outcomes = []
    for _ in range(2):  # the second process is the server after a restart
        async with Client(params) as client:
            outcomes.append(await call(client, "charge", {"amount": 5}, key="order-7"))
    assert isinstance(outcomes[0], dict) and unmarked(outcomes[1]) == outcomes[0]
    assert (tmp_path / "ledger.txt").read_text() == "5\n"
