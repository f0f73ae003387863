"""What an operator sees of the gateway: a startup line, and probes for a load balancer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from tests.gateway.processes import free_port

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.gateway.processes import Child, Upstream

ONE_MODE = pytest.mark.parametrize("upstream", ["stateless"], indirect=True)


@ONE_MODE
async def test_the_startup_line_says_where_what_and_how_callers_are_told_apart(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    gateway = gateways(upstream.url, "memory://", "--caller", "header:x-api-key")
    text = gateway.log.read_text()
    assert f"listening on http://127.0.0.1:{gateway.port}/mcp for {upstream.url}" in text
    assert "store memory://" in text
    assert "callers by header:x-api-key, unidentified relay" in text


@ONE_MODE
async def test_probes_answer_without_reaching_the_mcp_path(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    gateway = gateways(upstream.url)
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(base + "/healthz")
        ready = await client.get(base + "/readyz")
    assert (health.status_code, health.text) == (200, "ok\n")
    assert (ready.status_code, ready.text) == (200, "ready\n")
    assert upstream.executions() == []


async def test_readiness_fails_while_the_upstream_is_unreachable_and_health_does_not(
    gateways: Callable[..., Child],
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/mcp"
    gateway = gateways(nowhere)
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(base + "/healthz")
        ready = await client.get(base + "/readyz")
    assert health.status_code == 200
    assert ready.status_code == 503
    assert ready.text == "not ready: upstream: ConnectError\n"
