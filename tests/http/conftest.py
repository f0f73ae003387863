"""An ``httpx`` client on the test app (Starlette or FastAPI) through the ASGI transport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.http.apps import FRAMEWORKS, create_app
from tests.memory_store import store as store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from starlette.applications import Starlette

    from idemstore.protocol import IdempotencyStore

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


def keyed(key: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` (Alice's when not given) with ``Idempotency-Key`` as an RFC 8941 sf-string."""
    return {**(ALICE if headers is None else headers), "Idempotency-Key": f'"{key}"'}


async def post_twice(
    client: httpx.AsyncClient, path: str, key: str, **request: Any
) -> tuple[httpx.Response, httpx.Response]:
    """A keyed POST of Alice's and its retry, one after the other: (first, again)."""
    first = await client.post(path, headers=keyed(key), **request)
    again = await client.post(path, headers=keyed(key), **request)
    return first, again


def assert_replay_of(again: httpx.Response, first: httpx.Response) -> None:
    """``again`` is ``first``'s recorded answer, replayed: same status and body, marked."""
    assert again.headers["idempotent-replayed"] == "true"
    assert again.status_code == first.status_code
    assert again.content == first.content


def assert_ran_once_replayed_and_refused(
    app: Starlette,
    name: str,
    first: httpx.Response,
    again: httpx.Response,
    changed: httpx.Response,
) -> None:
    """Three requests under one key: ``again`` replayed ``first``, ``changed`` (another
    request) was refused as a mismatch (422), and the app ran ``name`` once."""
    assert_replay_of(again, first)
    assert changed.status_code == 422
    assert calls(app, name) == 1


def calls(app: Starlette, name: str) -> int:
    """How many times the test app ran ``name`` (a handler or a background step)."""
    return sum(1 for called in app.state.calls if called == name)


def client_of(app: Starlette, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    """A client on ``app`` in process; ``raise_app_exceptions=False`` answers an exception
    that escapes the app with a 500, as a server would, instead of raising it in the test."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_client(framework: str, store: IdempotencyStore) -> Callable[..., Any]:
    """``make_client(**options)``: (app, client) for an app with these middleware options."""

    def make(**options: Any) -> tuple[Starlette, httpx.AsyncClient]:
        app = create_app(framework, store, **options)
        return app, client_of(app)

    return make


@pytest.fixture
async def app_client(
    make_client: Callable[..., Any],
) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    app, client = make_client()
    async with client:
        yield app, client
