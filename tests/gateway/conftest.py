from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from tests.gateway.processes import Child, Upstream, start_gateway, start_upstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

UPSTREAM_MODES = ["stateful", "stateless", "stateless-json"]
# For tests whose tools the upstream answers before FastMCP sees them: one mode is enough.
ONE_MODE = pytest.mark.parametrize("upstream", ["stateless"], indirect=True)


@pytest.fixture(params=UPSTREAM_MODES)
def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Upstream]:
    """The upstream FastMCP server in each Streamable HTTP mode."""
    server = start_upstream(tmp_path, request.param)
    try:
        yield server
    finally:
        server.child.stop()


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start gateway processes: ``gateways(upstream_url, store_url, *options)``."""
    started: list[Child] = []

    def start(upstream: str, store: str = "memory://", *options: str) -> Child:
        child = start_gateway(tmp_path, upstream, store, *options)
        started.append(child)
        return child

    yield start
    for child in started:
        child.stop()


def gateway_url(child: Child) -> str:
    return f"http://127.0.0.1:{child.port}/mcp"


@pytest.fixture
def gateway(upstream: Upstream, gateways: Callable[..., Child]) -> str:
    """The URL of one gateway with the default options (memory store) in front of ``upstream``."""
    return gateway_url(gateways(upstream.url))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """A client patient enough for the slowest tool an upstream runs."""
    async with httpx.AsyncClient(timeout=30) as opened:
        yield opened
