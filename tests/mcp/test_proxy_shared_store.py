"""Two proxy processes sharing one store and one run id execute a call once between them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from tests.conftest import backend_unavailable
from tests.mcp.raw import executions, mock_command, proxy_command, unmarked

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]

# Stores several processes can share: backend -> the fixture giving a fresh store's URL.
SHARED_STORE_URL_FIXTURES = {
    "sqlite": "sqlite_file_store_url",
    "redis": "redis_store_url",
}


@pytest.fixture(params=sorted(SHARED_STORE_URL_FIXTURES))
def shared_store_url(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    name = SHARED_STORE_URL_FIXTURES[backend]
    try:
        url: str = request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        backend_unavailable(backend, f"no {name} fixture (the {backend} backend is not merged)")
    return url


@pytest.mark.slow
async def test_two_proxies_with_one_run_id_execute_once_between_them(
    spawn: Spawn, counter: Path, shared_store_url: str
) -> None:
    server = mock_command("--counter", str(counter))
    options = ("--store", shared_store_url, "--run-id", "shared-run")
    first = await spawn(proxy_command(*options, server=server))
    second = await spawn(proxy_command(*options, server=server))
    arguments = {"amount": 11, "seconds": 0.5}
    await first.call(1, "charge", arguments=arguments)
    await second.call(1, "charge", arguments=arguments)
    answers = await asyncio.gather(first.response(1), second.response(1))
    assert unmarked(answers[0]["result"]) == unmarked(answers[1]["result"])
    assert len(executions(counter)) == 1
    # Explicit keys are shared too (their scope is the user and the server command).
    await first.call(2, "charge", arguments={"amount": 12}, idempotencyKey="order-12")
    original = await first.response(2)
    await second.call(2, "charge", arguments={"amount": 12}, idempotencyKey="order-12")
    assert unmarked((await second.response(2))["result"]) == original["result"]
    assert len(executions(counter)) == 2
    assert await first.close() == 0
    assert await second.close() == 0
