"""The middleware checks its options when it is built, and can own a store given by URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from idemstore import open_store
from idemstore.errors import ConfigurationError
from idemstore.http.asgi import IdempotencyMiddleware
from tests.http.apps import create_app
from tests.http.conftest import assert_replay_of, client_of, post_twice

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore


async def bare_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"store": object()}, TypeError, "store must be an IdempotencyStore"),
        ({"store": None}, TypeError, "store URL string"),
        ({"store": "nosuch://x"}, ConfigurationError, "known schemes"),
        ({"store": "memory://?colour=blue"}, ConfigurationError, "colour"),
        ({"methods": ()}, ConfigurationError, "at least one method"),
        ({"methods": ["POST", 1]}, TypeError, "strings such as 'POST'"),
        ({"methods": "PO ST"}, ConfigurationError, "not an HTTP method"),
        ({"methods": 5}, TypeError, "method names"),
        ({"required": 3}, TypeError, "path patterns"),
        ({"required": ["/orders/*", None]}, TypeError, "path patterns must be strings"),
        ({"caller": "tenant"}, ConfigurationError, "callable"),
        ({"caller_sources": "cookie:session"}, ConfigurationError, "list of sources"),
        ({"caller_sources": ["cookie:*"]}, ConfigurationError, "every cookie"),
        ({"caller_sources": ["query:*"]}, ConfigurationError, "every query"),
        ({"retention": 0}, ConfigurationError, "retention"),
        ({"lease_ttl": "30"}, ConfigurationError, "lease_ttl"),
        ({"max_body_bytes": -1}, ConfigurationError, "max_body_bytes"),
        ({"max_response_bytes": True}, ConfigurationError, "max_response_bytes"),
        ({"max_key_length": 0}, ConfigurationError, "max_key_length"),
        ({"record_server_errors": "yes"}, TypeError, "record_server_errors"),
        ({"on_takeover": "maybe"}, ConfigurationError, "on_takeover"),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else "",
)
def test_a_wrong_option_fails_when_the_middleware_is_built(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    options.setdefault("store", "memory://")
    with pytest.raises(error, match=says):
        IdempotencyMiddleware(bare_app, **options)


def test_an_app_that_is_not_callable_fails_when_the_middleware_is_built() -> None:
    with pytest.raises(TypeError, match="ASGI app"):
        IdempotencyMiddleware("app", store="memory://")  # type: ignore[arg-type]


async def test_a_store_url_is_opened_by_the_middleware(framework: str) -> None:
    app = create_app(framework, "memory://")  # type: ignore[arg-type]
    async with client_of(app) as client:
        first, again = await post_twice(client, "/orders", "k-url", json={})
    assert_replay_of(again, first)


async def run_lifespan(app: Callable[..., Any]) -> list[str]:
    """Start the app up and shut it down as an ASGI server does; the messages it sent."""
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    return sent


async def test_a_store_opened_from_a_url_is_closed_at_lifespan_shutdown() -> None:
    from starlette.applications import Starlette

    middleware = IdempotencyMiddleware(Starlette(), store="memory://")
    await middleware.store.ping()
    sent = await run_lifespan(middleware)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(RuntimeError, match="closed"):
        await middleware.store.ping()


async def test_a_store_passed_in_is_left_open_at_lifespan_shutdown() -> None:
    from starlette.applications import Starlette

    async with open_store("memory://") as store:
        middleware = IdempotencyMiddleware(Starlette(), store=store)
        await run_lifespan(middleware)
        await store.ping()  # still open: its owner closes it


def test_options_are_checked_through_add_middleware_too(store: IdempotencyStore) -> None:
    # Starlette builds its middleware on the first event (the lifespan's startup): the
    # mistake is reported there, before any request.
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    app = Starlette()
    app.add_middleware(IdempotencyMiddleware, store=store, methods=())
    with pytest.raises(ConfigurationError, match="at least one method"), TestClient(app):
        pass
