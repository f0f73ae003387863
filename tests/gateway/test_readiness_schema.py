"""The gateway's ``/readyz`` is not ready while its store's schema is not migrated: it reads
the store as a request would (``store_ready``) instead of only pinging the engine."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.gateway.processes import Child, Upstream


@pytest.mark.parametrize("upstream", ["stateless"], indirect=True)
async def test_readiness_fails_while_the_stores_schema_is_not_migrated(
    upstream: Upstream, gateways: Callable[..., Child], postgres_server: str
) -> None:
    gateway = gateways(upstream.url, f"{postgres_server}?schema=never_{uuid.uuid4().hex[:8]}")
    async with httpx.AsyncClient(timeout=10) as client:
        ready = await client.get(f"http://127.0.0.1:{gateway.port}/readyz")
    assert (ready.status_code, ready.text) == (503, "not ready: store: SchemaError\n")
