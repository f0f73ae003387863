"""Drive ``idemstore proxy`` (or a server directly) with raw JSON-RPC lines over pipes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.mcp.sep3182 import REPLAYED_META_KEY

if TYPE_CHECKING:
    from collections.abc import Iterable

ROOT = Path(__file__).resolve().parents[2]
MOCK_SERVER = str(Path(__file__).with_name("mock_server.py"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def proxy_command(*options: str, server: list[str]) -> list[str]:
    return [sys.executable, "-m", "idemstore", "proxy", *options, "--", *server]


def mock_command(*options: str) -> list[str]:
    return [sys.executable, MOCK_SERVER, *options]


def executions(counter: Path) -> list[dict[str, Any]]:
    """What the mock server executed, one entry per execution."""
    if not counter.exists():
        return []
    return [json.loads(line) for line in counter.read_text().splitlines()]


async def until_executed(counter: Path, count: int = 1) -> None:
    """Return once the mock server has executed ``count`` calls (within 5 s)."""
    for _ in range(500):
        if len(executions(counter)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server did not execute {count} call(s)")


def unmarked(result: dict[str, Any]) -> dict[str, Any]:
    """A replayed result without the replay marker (and a ``_meta`` it alone filled)."""
    meta = result.get("_meta")
    if not isinstance(meta, dict):
        return result
    meta = {k: v for k, v in meta.items() if k != REPLAYED_META_KEY}
    rest = {k: v for k, v in result.items() if k != "_meta"}
    return {**rest, "_meta": meta} if meta else rest


class RawPeer:
    """A process spoken to in newline-delimited JSON-RPC; every stdout line must be JSON."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[bytes] = []  # every line read, in order
        self._unclaimed: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, command: list[str], **kwargs: Any) -> RawPeer:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=ENV,
            limit=64 * 1024 * 1024,
            **kwargs,
        )
        return cls(process)

    async def send(self, message: dict[str, Any] | list[Any] | bytes) -> None:
        assert self.process.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def read_line(self, timeout: float = 20) -> bytes:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise EOFError("the peer closed its output")
        json.loads(line)  # nothing but protocol messages on stdout
        self.lines.append(line)
        return line

    async def response(self, request_id: object, timeout: float = 20) -> dict[str, Any]:
        """The response to ``request_id``; other messages read meanwhile are kept for later."""
        for message in self._unclaimed:
            if isinstance(message, dict) and message.get("id") == request_id:
                self._unclaimed.remove(message)
                return message
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            message = json.loads(await self.read_line(deadline - loop.time()))
            if (
                isinstance(message, dict)
                and "method" not in message
                and message.get("id") == request_id
            ):
                return message
            self._unclaimed.append(message)

    async def request(
        self, request_id: object, method: str, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.response(request_id)

    async def call(self, request_id: object, name: str, **params: Any) -> None:
        """Send a tools/call without waiting: ``arguments``, ``idempotencyKey``, ``_meta``..."""
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": name, **params},
            }
        )

    async def call_each(
        self, request_ids: Iterable[object], name: str, **params: Any
    ) -> list[dict[str, Any]]:
        """The same tools/call under each id in turn, each sent once the one before is
        answered (a client retrying); the responses, in order."""
        responses = []
        for request_id in request_ids:
            await self.call(request_id, name, **params)
            responses.append(await self.response(request_id))
        return responses

    async def initialize(self) -> dict[str, Any]:
        response = await self.request(
            0,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response

    async def close(self, timeout: float = 20) -> int:
        """Close stdin (as a host does) and return the exit status."""
        assert self.process.stdin is not None
        with contextlib.suppress(ConnectionError):
            self.process.stdin.close()
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
