"""FastAPI the FastAPI way (issue #40, case 1): the principal comes from the app's own auth
dependencies, through ``idemstore.http.fastapi``; a PostgreSQL store, as in the issue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware

from idemstore import open_store
from idemstore.callers import Principal
from idemstore.http.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.http.fastapi import IdempotencyMiddleware, idempotency_key
from tests.http.conftest import assert_replay_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore.protocol import IdempotencyStore

# What the app's token check knows: ann's token is refreshed from v1 to v2.
TOKENS = {"token-v1": "ann", "token-v2": "ann", "token-b": "ben"}
bearer = HTTPBearer()


def current_user(credentials: Annotated[HTTPAuthorizationCredentials, Depends(bearer)]) -> str:
    user = TOKENS.get(credentials.credentials)
    if user is None:
        raise HTTPException(401, "unknown token")
    return user


def caller(user: Annotated[str, Depends(current_user)]) -> Principal:
    return Principal("accounts", user)


def orders_app(store: IdempotencyStore, how: str = "dependency", **options: Any) -> FastAPI:
    """``POST /orders`` and ``POST /required`` (a key required), the caller known ``how``."""
    app = FastAPI()
    app.state.calls = 0
    keyed = Depends(idempotency_key(caller if how == "dependency" else None))
    if how == "starlette-user":  # no dependency on the route: the middleware decides alone
        keyed = Depends(lambda: None)
    required = Depends(idempotency_key(caller, required=True))

    @app.post("/orders", status_code=201, dependencies=[keyed])
    async def create_order(order: dict[str, Any], request: Request) -> dict[str, Any]:
        app.state.calls += 1
        return {"order": order, "n": app.state.calls}

    @app.post("/required", status_code=201, dependencies=[required])
    async def create_required(request: Request) -> dict[str, Any]:
        app.state.calls += 1
        return {"n": app.state.calls}

    @app.post("/flaky", status_code=201, dependencies=[keyed])
    async def flaky(request: Request) -> dict[str, Any]:
        app.state.calls += 1
        if app.state.calls == 1:
            raise RuntimeError("the card network hung up")
        return {"n": app.state.calls}

    if how == "caller":
        tokens = {f"Bearer {token}".encode(): user for token, user in TOKENS.items()}

        def from_scope(scope: Any) -> Principal | None:
            found = [tokens.get(v) for k, v in scope["headers"] if k == b"authorization"]
            return Principal("accounts", found[0]) if found and found[0] else None

        options["caller"] = from_scope
    if how == "starlette-user-inside":  # added first: runs after the idempotency middleware
        app.add_middleware(AuthenticationMiddleware, backend=TokenAuth())
    middleware = options.pop("middleware", IdempotencyMiddleware)
    app.add_middleware(middleware, store=store, **options)
    if how == "starlette-user":  # added last: runs first
        app.add_middleware(AuthenticationMiddleware, backend=TokenAuth())
    return app


class TokenAuth(AuthenticationBackend):
    async def authenticate(self, conn: Any) -> Any:
        _, _, token = conn.headers.get("authorization", "").partition(" ")
        user = TOKENS.get(token)
        return (AuthCredentials(["authenticated"]), SimpleUser(user)) if user else None


@pytest.fixture
async def store(postgres_store_url: str) -> AsyncIterator[IdempotencyStore]:
    async with open_store(postgres_store_url) as opened:
        yield opened


def client_of(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def order(client: httpx.AsyncClient, token: str, key: str = "k", **body: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": f'"{key}"'}
    return await client.post("/orders", json=body or {"sku": "A1"}, headers=headers)


@pytest.mark.parametrize("how", ["dependency", "starlette-user", "starlette-user-inside", "caller"])
async def test_a_retry_after_a_token_refresh_replays(store: IdempotencyStore, how: str) -> None:
    app = orders_app(store, how)
    async with client_of(app) as client:
        first = await order(client, "token-v1")
        ben = await order(client, "token-b")
        again = await order(client, "token-v2")
    assert first.status_code == ben.status_code == 201
    assert_replay_of(again, first)
    assert "idempotent-replayed" not in ben.headers
    assert app.state.calls == 2


async def test_without_a_principal_a_refreshed_token_is_a_new_caller(
    store: IdempotencyStore,
) -> None:
    # The documented price of deciding by credential bytes (the start-up log says so).
    app = orders_app(store, "no principal")
    async with client_of(app) as client:
        first = await order(client, "token-v1")
        again = await order(client, "token-v2")
    assert first.status_code == again.status_code == 201
    assert "idempotent-replayed" not in again.headers


async def test_the_dependency_answers_refusals_as_the_middleware_does(
    store: IdempotencyStore,
) -> None:
    app = orders_app(store)
    async with client_of(app) as client:
        await order(client, "token-v1", sku="A1")
        other = await order(client, "token-v2", sku="B2")
        unknown = await order(client, "nobody-s-token")
        missing = await client.post("/required", headers={"Authorization": "Bearer token-b"})
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert unknown.status_code == 401  # the app's own answer: nothing reserved, nothing run
    assert missing.status_code == 400 and "required" in missing.json()["title"]
    assert app.state.calls == 1


async def test_an_unauthenticated_try_leaves_the_key_free(store: IdempotencyStore) -> None:
    app = orders_app(store)
    async with client_of(app) as client:
        refused = await order(client, "nobody-s-token")
        first = await order(client, "token-v1")
        again = await order(client, "token-v1")
    assert refused.status_code == 401
    assert first.status_code == 201
    assert_replay_of(again, first)


async def test_the_dependency_needs_the_fastapi_middleware(store: IdempotencyStore) -> None:
    # The plain ASGI middleware reserves before the route runs: the dependency says so loudly
    # (a 500, the key released) rather than letting the principal silently not count.
    app = orders_app(store, middleware=ASGIIdempotencyMiddleware)
    async with client_of(app) as client:
        response = await order(client, "token-v1")
    assert response.status_code == 500
    assert app.state.calls == 0


async def test_an_endpoint_that_raises_releases_the_key(store: IdempotencyStore) -> None:
    app = orders_app(store)
    headers = {"Authorization": "Bearer token-v1", "Idempotency-Key": '"flaky"'}
    async with client_of(app) as client:
        crashed = await client.post("/flaky", headers=headers)
        retried = await client.post("/flaky", headers=headers)
        replayed = await client.post("/flaky", headers=headers)
    assert crashed.status_code == 500
    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert_replay_of(replayed, retried)
    assert app.state.calls == 2


def test_the_openapi_schema_declares_the_header(store: IdempotencyStore) -> None:
    operation = orders_app(store).openapi()["paths"]["/orders"]["post"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert headers["Idempotency-Key"]["required"] is False
    assert "retry" in headers["Idempotency-Key"]["description"]
