"""An ``httpx`` client on the test app (Starlette or FastAPI) through the ASGI transport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from idemstore import open_store
from tests.http.apps import FRAMEWORKS, create_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from starlette.applications import Starlette

    from idemstore.protocol import IdempotencyStore

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


def keyed(key: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """Alice's headers with ``Idempotency-Key`` as an RFC 8941 sf-string."""
    return {**(headers or ALICE), "Idempotency-Key": f'"{key}"'}


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store() -> AsyncIterator[IdempotencyStore]:
    async with open_store("memory://") as opened:
        yield opened


@pytest.fixture
def make_client(framework: str, store: IdempotencyStore) -> Callable[..., Any]:
    """``make_client(**options)``: (app, client) for an app with these middleware options."""

    def make(**options: Any) -> tuple[Starlette, httpx.AsyncClient]:
        app = create_app(framework, store, **options)
        transport = httpx.ASGITransport(app=app)
        return app, httpx.AsyncClient(transport=transport, base_url="http://testserver")

    return make


@pytest.fixture
async def app_client(
    make_client: Callable[..., Any],
) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    app, client = make_client()
    async with client:
        yield app, client
