"""Issue 42 under a real uvicorn: one outcome rule for a response that cannot be recorded,
event streams recorded as they are sent and replayed byte for byte, a retry that follows the
running original, and a stream the server cut (not an outcome: its key is released)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import httpx
import pytest

from idemstore.local_servers import free_port
from tests.http.conftest import keyed
from tests.loopback_process import Child

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def fastapi_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    app = "tests.http.apps:fastapi_uvicorn_app"
    argv = [sys.executable, "-m", "uvicorn", app, "--factory", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--no-access-log"]
    with Child(argv, port, tmp_path_factory.mktemp("uvicorn") / "uvicorn.log"):
        yield f"http://127.0.0.1:{port}"


async def runs(client: httpx.AsyncClient, name: str) -> int:
    calls: list[str] = (await client.get("/calls")).json()
    return calls.count(name)


async def test_a_3_mb_response_runs_once_and_its_retries_get_the_refusal(fastapi_url: str) -> None:
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        before = await runs(client, "big")
        first = await client.post(f"/big?size={3 * MIB}", headers=keyed("u42-big"))
        assert first.status_code == 200 and len(first.content) > 3 * MIB
        for _ in range(2):
            retry = await client.post(f"/big?size={3 * MIB}", headers=keyed("u42-big"))
            assert retry.status_code == 409
            assert retry.headers["content-type"] == "application/problem+json"
            document = retry.json()
            assert document["type"].endswith("/refusals/#outcome_unrecorded")
            assert f"{len(first.content)} bytes" in document["detail"]
            assert f"{MIB} bytes" in document["detail"]
            assert "retry-after" not in retry.headers
        assert await runs(client, "big") == before + 1


async def test_an_sse_post_of_50_events_replays_byte_identical(fastapi_url: str) -> None:
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        before = await runs(client, "ticks")
        first = await client.post("/ticks?events=50", headers=keyed("u42-sse"))
        again = await client.post("/ticks?events=50", headers=keyed("u42-sse"))
        assert first.status_code == again.status_code == 200
        assert first.content.count(b"\n\n") == 50 and b"id: 49\n" in first.content
        assert again.content == first.content
        assert again.headers["content-type"] == first.headers["content-type"]
        assert again.headers["idempotent-replayed"] == "true"
        assert await runs(client, "ticks") == before + 1


async def test_a_retry_after_the_10th_event_receives_all_50_live(fastapi_url: str) -> None:
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        before = await runs(client, "ticks")
        path = "/ticks?events=50&delay=0.01"
        async with client.stream("POST", path, headers=keyed("u42-live")) as original:
            received = b""
            retry = None
            async for chunk in original.aiter_bytes():
                received += chunk
                if retry is None and received.count(b"\n\n") >= 10:
                    assert received.count(b"\n\n") < 50  # the original is still sending
                    retry = asyncio.create_task(client.post(path, headers=keyed("u42-live")))
        assert retry is not None
        followed = await asyncio.wait_for(retry, 10)
        assert followed.status_code == 200
        assert followed.headers["idempotent-replayed"] == "true"
        assert followed.content == received and received.count(b"\n\n") == 50
        assert await runs(client, "ticks") == before + 1


async def test_a_stream_cut_by_the_server_is_released_and_its_retry_runs(
    fastapi_url: str,
) -> None:
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        before = await runs(client, "ticks")
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/ticks?events=50&cut=10", headers=keyed("u42-cut"))
        # Not an outcome: the key was released, so the retry runs (and is cut again).
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/ticks?events=50&cut=10", headers=keyed("u42-cut"))
        assert await runs(client, "ticks") == before + 2


async def test_a_stream_whose_client_left_is_released_and_its_retry_runs(fastapi_url: str) -> None:
    path = "/ticks?events=50&delay=0.01"
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        before = await runs(client, "ticks")
        async with client.stream("POST", path, headers=keyed("u42-gone")) as original:
            async for chunk in original.aiter_bytes():
                if b"id: 9\n" in chunk:
                    break  # the client leaves after the 10th event
    # The server notices at its next event (10 ms): give it that, so the retry does not
    # find the original still running (it would follow it).
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=fastapi_url, timeout=20) as client:
        # Not an outcome: once the server noticed, the key is released and the retry runs.
        for _ in range(100):
            retry = await client.post(path, headers=keyed("u42-gone"))
            if retry.status_code != 409:
                break
            await asyncio.sleep(0.05)
        assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
        assert retry.content.count(b"\n\n") == 50
        assert await runs(client, "ticks") == before + 2
