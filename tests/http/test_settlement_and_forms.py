"""Issue 14, cases 1 and 6 in-process (httpx over ASGI): when the response is settled, and
how form bodies are compared. The same cases run under uvicorn in test_uvicorn.py."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from tests.http.apps import create_app
from tests.http.conftest import ALICE, assert_replay_of, calls, client_of, keyed, post_twice

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import httpx

    from idemstore.protocol import IdempotencyStore

    AppClient = tuple[Any, httpx.AsyncClient]

PHOTO = bytes(range(256)) * 16


async def test_a_background_task_that_raises_keeps_the_recorded_response(
    framework: str, store: IdempotencyStore
) -> None:
    app = create_app(framework, store)
    # The app's exception still reaches the server (as without the middleware); the client
    # has its complete response by then.
    async with client_of(app, raise_app_exceptions=False) as client:
        first, again = await post_twice(client, "/charge?fail=now", "bg-now")
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert calls(app, "charge") == 1
    assert calls(app, "receipt-failed") == 1


async def upload(
    client: httpx.AsyncClient,
    key: str,
    *,
    photo: bytes = PHOTO,
    filename: str = "beach.png",
    content_type: str = "image/png",
    caption: str = "holiday",
) -> httpx.Response:
    return await client.post(
        "/upload",
        data={"caption": caption},
        files={"photo": (filename, photo, content_type)},
        headers=keyed(key),
    )


async def test_multipart_retry_with_a_new_boundary_replays(app_client: AppClient) -> None:
    app, client = app_client
    first = await upload(client, "mp")
    again = await upload(client, "mp")
    assert_replay_of(again, first)
    assert calls(app, "upload") == 1


async def test_multipart_with_other_content_conflicts(app_client: AppClient) -> None:
    app, client = app_client
    assert (await upload(client, "mp-x")).status_code == 200
    changed: list[dict[str, Any]] = [
        {"photo": PHOTO + b"!"},
        {"filename": "other.png"},
        {"content_type": "image/jpeg"},
        {"caption": "work"},
    ]
    for change in changed:
        response = await upload(client, "mp-x", **change)
        assert response.status_code == 422, change
    assert calls(app, "upload") == 1


async def test_urlencoded_forms_compare_by_decoded_fields(app_client: AppClient) -> None:
    app, client = app_client
    form = {**ALICE, "Content-Type": "application/x-www-form-urlencoded"}
    first = await client.post(
        "/upload", content=b"name=Ada+Lovelace&city=L%6Fndon", headers=keyed("f", form)
    )
    same = await client.post(
        "/upload", content=b"name=Ada%20Lovelace&city=London", headers=keyed("f", form)
    )
    other = await client.post(
        "/upload", content=b"city=London&name=Ada%20Lovelace", headers=keyed("f", form)
    )
    assert_replay_of(same, first)
    assert other.status_code == 422  # field order is part of a form
    assert calls(app, "upload") == 1


async def test_malformed_multipart_compares_byte_for_byte(app_client: AppClient) -> None:
    app, client = app_client
    headers = keyed("bad-mp", {**ALICE, "Content-Type": "multipart/form-data; boundary=xyz"})
    body = b"--xyz\r\nno colon here\r\n\r\ndata\r\n--xyz--\r\n"
    first = await client.post("/upload", content=body, headers=headers)
    again = await client.post("/upload", content=body, headers=headers)
    changed = await client.post("/upload", content=body.replace(b"data", b"dat4"), headers=headers)
    assert_replay_of(again, first)
    assert changed.status_code == 422
    assert calls(app, "upload") == 1


async def test_multipart_over_the_body_limit_is_still_413(
    make_client: Callable[..., Any],
) -> None:
    app, client = make_client(max_body_bytes=1000)
    async with client:
        response = await upload(client, "too-big", photo=b"x" * 2000)
    assert response.status_code == 413
    assert calls(app, "upload") == 0


async def test_an_app_cancelled_before_its_response_releases_the_key(
    app_client: AppClient,
) -> None:
    app, client = app_client
    # httpx's ASGI transport runs the app in the client's task: cancelling the request
    # cancels the app mid-handler, as a server shutting down does.
    request = asyncio.create_task(client.post("/slow", headers=keyed("cancelled")))
    await app.state.started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    app.state.gate.set()
    retry = await client.post("/slow", headers=keyed("cancelled"))
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
    assert calls(app, "slow") == 2
