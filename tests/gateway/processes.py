"""Real processes for the gateway tests: the upstream FastMCP server and gateway replicas.

Each runs as its own subprocess on a free loopback port (``tests.loopback_process.Child``):
started, it accepts connections, or the test fails with the process's output.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.loopback_process import ENV, Child

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ENV", "Child", "Upstream", "free_port", "start_gateway", "start_upstream"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Upstream:
    """The upstream FastMCP server: its endpoint and its execution log."""

    child: Child
    executions_log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.child.port}/mcp"

    def executions(self, name: str | None = None) -> list[str]:
        if not self.executions_log.exists():
            return []
        lines = self.executions_log.read_text().split()
        return [line for line in lines if name is None or line == name]

    async def until_executed(self, name: str, count: int = 1) -> None:
        for _ in range(1000):
            if len(self.executions(name)) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{name} did not execute {count} time(s)")


def start_upstream(
    where: Path,
    mode: str,
    port: int | None = None,
    *,
    tokens: Path | None = None,
    jwks: Path | None = None,
    revoked: Path | None = None,
) -> Upstream:
    """``mode``: ``stateful``, ``stateless`` (both answer with SSE) or ``stateless-json``;
    ``tokens``: the file of tokens an authenticating upstream accepts; ``jwks`` and
    ``revoked``: the keys and the revoked tokens its ``charge`` tool authorizes by."""
    port = port or free_port()
    log = where / f"executions-{port}.log"
    argv = [sys.executable, "-m", "tests.gateway.upstream", "--port", str(port), "--log", str(log)]
    if tokens is not None:
        argv += ["--tokens", str(tokens)]
    if jwks is not None:
        argv += ["--jwks", str(jwks)]
    if revoked is not None:
        argv += ["--revoked", str(revoked)]
    if mode.startswith("stateless"):
        argv.append("--stateless")
    if mode.endswith("json"):
        argv.append("--json")
    child = Child(argv, port, where / f"upstream-{port}.out").start()
    return Upstream(child, log)


def start_gateway(where: Path, upstream: str, store: str, *options: str) -> Child:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "idemstore",
        "gateway",
        "--listen",
        f"127.0.0.1:{port}",
        "--upstream",
        upstream,
        "--store",
        store,
        *options,
    ]
    return Child(argv, port, where / f"gateway-{port}.out").start()
