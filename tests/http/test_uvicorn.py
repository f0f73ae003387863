"""The middleware under a real uvicorn on loopback, spoken to over real HTTP."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import httpx
import pytest

from idemstore.local_servers import free_port
from tests.http.conftest import ALICE, assert_replay_of, keyed, post_twice
from tests.loopback_process import Child

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def uvicorn_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    app = "tests.http.apps:uvicorn_app"
    argv = [sys.executable, "-m", "uvicorn", app, "--factory", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--no-access-log"]
    with Child(argv, port, tmp_path / "uvicorn.log"):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.slow
async def test_rules_hold_under_uvicorn(uvicorn_url: str) -> None:
    async with httpx.AsyncClient(base_url=uvicorn_url, timeout=10) as client:
        first, again = await post_twice(client, "/orders", "u-1", json={"sku": "A1"})
        assert first.status_code == again.status_code == 201
        assert_replay_of(again, first)
        assert again.headers["location"] == first.headers["location"]

        other = await client.post("/orders", json={"sku": "B2"}, headers=keyed("u-1"))
        assert other.status_code == 422
        assert other.headers["content-type"] == "application/problem+json"

        missing = await client.post("/required/orders", json={}, headers=ALICE)
        assert missing.status_code == 400

        original = asyncio.create_task(client.post("/slow?seconds=1", headers=keyed("u-slow")))
        await asyncio.sleep(0.3)
        duplicate = await client.post("/slow?seconds=1", headers=keyed("u-slow"))
        done = await original
        assert done.status_code == duplicate.status_code == 200  # it followed the original
        assert duplicate.content == done.content
        replay = await client.post("/slow?seconds=1", headers=keyed("u-slow"))
        assert replay.content == done.content

        # The app's recording limit is 4096 bytes: a bigger response is sent whole, not kept,
        # and not run again under its key.
        big = await client.post("/big?size=10000", headers=keyed("u-big"))
        big_again = await client.post("/big?size=10000", headers=keyed("u-big"))
        assert len(big.content) == 10001
        assert big_again.status_code == 409
        assert (await client.get("/calls")).json().count("big") == 1


@pytest.mark.slow
async def test_background_task_neither_delays_nor_fails_the_recorded_response(
    uvicorn_url: str,
) -> None:
    # Issue 14, case 1. The receipt (a BackgroundTask) is held until /receipts is opened, so
    # the response can only arrive if the middleware sends it at the last body message.
    # No keep-alive: uvicorn closes a connection whose app raised, even after its response.
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=uvicorn_url, timeout=10, limits=fresh) as client:
        first = await asyncio.wait_for(client.post("/charge", headers=keyed("bg-1")), 8)
        assert first.status_code == 201
        assert (await client.get("/calls")).json() == ["charge"]
        # The outcome is recorded already, while its background work still runs.
        retry = await client.post("/charge", headers=keyed("bg-1"))
        assert retry.status_code == 201
        assert_replay_of(retry, first)

        failing = await client.post("/charge?fail=1", headers=keyed("bg-2"))
        assert failing.status_code == 201
        await client.get("/receipts")
        calls = (await client.get("/calls")).json()
        while "receipt-failed" not in calls:
            await asyncio.sleep(0.05)
            calls = (await client.get("/calls")).json()
        # The receipt failed after the response was sent: not the request's failure. The key
        # keeps the recorded response and the card is charged once per key.
        again = await client.post("/charge?fail=1", headers=keyed("bg-2"))
        assert again.status_code == 201
        assert_replay_of(again, failing)
        calls = (await client.get("/calls")).json()
        assert calls.count("charge") == 2
        assert calls.count("receipt-failed") == 1


@pytest.mark.slow
async def test_retried_multipart_upload_replays_under_uvicorn(uvicorn_url: str) -> None:
    # Issue 14, case 6: httpx picks a new boundary for every request, as browsers do.
    photo = bytes(range(256)) * 40
    async with httpx.AsyncClient(base_url=uvicorn_url, timeout=10) as client:

        async def upload(content: bytes) -> httpx.Response:
            return await client.post(
                "/upload",
                data={"caption": "holiday", "album": "2026"},
                files={"photo": ("beach.png", content, "image/png")},
                headers=keyed("mp-1"),
            )

        first = await upload(photo)
        again = await upload(photo)
        assert first.status_code == again.status_code == 200
        assert_replay_of(again, first)
        other_file = await upload(photo[::-1])
        assert other_file.status_code == 422
        assert (await client.get("/calls")).json().count("upload") == 1
