from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.mcp.raw import RawPeer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    """Where the mock server records its executions."""
    return tmp_path / "executions.jsonl"


@pytest.fixture
async def spawn() -> AsyncIterator[Callable[[list[str]], Awaitable[RawPeer]]]:
    """Start processes to drive with raw JSON-RPC; whatever is left is killed afterwards."""
    peers: list[RawPeer] = []

    async def start(command: list[str]) -> RawPeer:
        peer = await RawPeer.start(command)
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        await peer.kill()
