"""Real processes for the gateway tests: the upstream FastMCP server and gateway replicas.

Each runs as its own subprocess on a free loopback port; ``wait_listening`` returns once it
accepts connections, or fails with the process's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Child:
    """A started process and the loopback port it serves."""

    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> Child:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, env=ENV, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
            )
        self.wait_listening()
        return self

    def wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.argv} exited:\n{self.log.read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.argv} did not listen within {START_TIMEOUT}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


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
    where: Path, mode: str, port: int | None = None, *, tokens: Path | None = None
) -> Upstream:
    """``mode``: ``stateful``, ``stateless`` (both answer with SSE) or ``stateless-json``;
    ``tokens``: the file of tokens an authenticating upstream accepts."""
    port = port or free_port()
    log = where / f"executions-{port}.log"
    argv = [sys.executable, "-m", "tests.gateway.upstream", "--port", str(port), "--log", str(log)]
    if tokens is not None:
        argv += ["--tokens", str(tokens)]
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
