"""The middleware's default caller rule: the one every consumer uses (idemstore.callers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.http.conftest import calls, keyed

if TYPE_CHECKING:
    import httpx
    from starlette.applications import Starlette


async def test_spellings_of_one_credential_are_one_caller(
    app_client: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = app_client
    for value in ["Bearer alice", "bearer alice", "Bearer  alice", "BEARER\talice"]:
        response = await client.post(
            "/orders", json={"sku": "A1"}, headers=keyed("k", {"Authorization": value})
        )
        assert response.status_code == 201
    assert calls(app, "create_order") == 1


async def test_a_session_cookie_names_the_caller(
    app_client: tuple[Starlette, httpx.AsyncClient],
) -> None:
    app, client = app_client
    statuses = []
    for session in ["alice", "alice", "bob"]:
        client.cookies.set("session", session)
        response = await client.post("/orders", json={"sku": "A1"}, headers=keyed("k", {}))
        statuses.append(response.status_code)
    assert statuses == [201, 201, 201]
    assert calls(app, "create_order") == 2  # alice's retry replayed; bob ran his own
