"""Issue 14, case 2: ``Idempotency.run`` cancelled while its ``reserve`` is on a slow network.

The fault proxy delays every chunk, so the reserve reaches the engine (and takes the key)
while its reply is still on the way back; the caller is cancelled in that window. The lease
the engine granted belongs to nobody: unless it is released, every retry waits (or is
rejected) for the whole lease_ttl.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from idemstore import Idempotency, Status, open_store
from idemstore.testing import FaultProxy
from tests.reliability.test_network_faults import warm_up

# Redis: one round trip per reserve; PostgreSQL: one statement (its function) per reserve.
ENGINES = {
    "redis": ("redis_store_url", "socket_timeout=10"),
    "postgres": ("postgres_store_url", "command_timeout=10"),
}
LATENCY = 1.0  # seconds per chunk, each way: the window in which the caller is cancelled
LONG_LEASE = 30.0


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
async def test_cancel_while_reserving_leaves_no_orphan_lease(
    request: pytest.FixtureRequest, engine: str
) -> None:
    fixture, options = ENGINES[engine]
    direct_url = request.getfixturevalue(fixture)
    key = f"slow-{uuid.uuid4().hex[:12]}"
    runs = 0

    async def charge() -> bytes:
        nonlocal runs
        runs += 1
        return b"charged"

    with FaultProxy.for_url(direct_url) as proxy:
        slow_url = proxy.route(direct_url) + "&" + options
        async with open_store(slow_url) as slow, open_store(direct_url) as direct:
            await warm_up(slow)
            proxy.latency = LATENCY
            idem = Idempotency(slow, lease_ttl=LONG_LEASE)
            task = asyncio.create_task(idem.run(key, "fp", charge))
            # Cancel once the engine holds the key, while the reply is still in the proxy.
            async with asyncio.timeout(10):
                while (record := await direct.get(key)) is None:  # noqa: ASYNC110 -- polls the engine
                    await asyncio.sleep(0.02)
            assert record.status is Status.IN_PROGRESS
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert runs == 0

            # A retry right away (on a fast path, rejecting rather than waiting) must own the
            # key, not find it held by a lease nobody owns for LONG_LEASE seconds.
            proxy.latency = 0.0
            retry = Idempotency(direct, lease_ttl=LONG_LEASE, in_flight="reject")
            result = await retry.run(key, "fp", charge)
            assert not result.replayed and result.value == b"charged"
            assert runs == 1
