"""The Idempotency-Key rules (IETF draft) through httpx, on a Starlette and a FastAPI app."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from idemstore.errors import ConfigurationError
from idemstore.http.asgi import IdempotencyMiddleware, parse_idempotency_key
from idemstore.testing import FakeClock
from tests.http.apps import create_app
from tests.http.conftest import (
    ALICE,
    BOB,
    assert_replay_of,
    calls,
    client_of,
    keyed,
    post_twice,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.applications import Starlette

    from idemstore.protocol import IdempotencyStore

AppClient = tuple["Starlette", httpx.AsyncClient]


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    document: dict[str, Any] = response.json()
    assert document["status"] == status
    assert document["detail"]
    return document


async def test_retry_replays_status_headers_and_body(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/orders", "k-1", json={"sku": "A1", "qty": 2})
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert calls(app, "create_order") == 1


async def test_equivalent_json_bodies_replay(app_client: AppClient) -> None:
    app, client = app_client
    first = await client.post(
        "/orders",
        content=b'{"sku": "caf\\u00e9", "qty": 1, "meta": {"a": 1, "b": 2}}',
        headers={**keyed("k-json"), "Content-Type": "application/json"},
    )
    again = await client.post(
        "/orders",
        content='{"meta":{"b":2.0,"a":1},"qty":1.0,"sku":"café"}'.encode(),
        headers={**keyed("k-json"), "Content-Type": "application/json; charset=utf-8"},
    )
    assert_replay_of(again, first)
    assert calls(app, "create_order") == 1


async def test_raw_bodies_compare_byte_for_byte(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/upload", "k-raw", content=b"\x00\x01payload")
    assert again.text == first.text
    changed = await client.post("/upload", content=b"\x00\x02payload", headers=keyed("k-raw"))
    problem(changed, 422)
    assert calls(app, "upload") == 1


async def test_request_without_key_runs_every_time(app_client: AppClient) -> None:
    app, client = app_client
    await client.post("/orders", json={"sku": "A1"}, headers=ALICE)
    await client.post("/orders", json={"sku": "A1"}, headers=ALICE)
    assert calls(app, "create_order") == 2


async def test_missing_key_where_required_is_400(app_client: AppClient) -> None:
    app, client = app_client
    document = problem(
        await client.post("/required/orders", json={"sku": "A1"}, headers=ALICE), 400
    )
    assert "Idempotency-Key" in document["detail"]
    assert calls(app, "create_order") == 0
    ok = await client.post("/required/orders", json={"sku": "A1"}, headers=keyed("k-req"))
    assert ok.status_code == 201


@pytest.mark.parametrize(
    "required",
    [True, lambda scope: scope["path"].startswith("/orders")],
    ids=["everywhere", "predicate"],
)
async def test_required_accepts_a_flag_or_a_predicate(
    make_client: Callable[..., Any], required: Any
) -> None:
    app, client = make_client(required=required)
    async with client:
        problem(await client.post("/orders", json={}, headers=ALICE), 400)
    assert calls(app, "create_order") == 0


async def test_reused_key_with_other_payload_is_422_and_does_not_run(app_client: AppClient) -> None:
    app, client = app_client
    await client.post("/orders", json={"sku": "A1", "qty": 2}, headers=keyed("k-2"))
    document = problem(
        await client.post("/orders", json={"sku": "A1", "qty": 3}, headers=keyed("k-2")), 422
    )
    assert document["idempotencyKey"] == "k-2"
    assert calls(app, "create_order") == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/orders?coupon=X"), ("PATCH", "/orders/7"), ("POST", "/upload")],
    ids=["query", "method-and-path", "path"],
)
async def test_reused_key_on_another_request_is_422(
    app_client: AppClient, method: str, path: str
) -> None:
    _app, client = app_client
    await client.post("/orders", json={"sku": "A1"}, headers=keyed("k-3"))
    response = await client.request(method, path, json={"sku": "A1"}, headers=keyed("k-3"))
    problem(response, 422)


async def test_a_concurrent_duplicate_in_this_process_follows_the_original(
    app_client: AppClient,
) -> None:
    app, client = app_client
    original = asyncio.create_task(client.post("/slow", headers=keyed("k-slow")))
    await asyncio.wait_for(app.state.started.wait(), 10)
    duplicate = asyncio.create_task(client.post("/slow", headers=keyed("k-slow")))
    await asyncio.sleep(0.05)
    assert not duplicate.done()  # following the original, not refused
    app.state.gate.set()
    first = await asyncio.wait_for(original, 5)
    followed = await asyncio.wait_for(duplicate, 5)
    assert first.status_code == followed.status_code == 200
    assert followed.content == first.content
    assert followed.headers["idempotent-replayed"] == "true"
    again = await client.post("/slow", headers=keyed("k-slow"))
    assert again.content == first.content
    assert calls(app, "slow") == 1


async def test_a_concurrent_duplicate_at_another_replica_is_409_without_running(
    make_client: Callable[..., Any],
) -> None:
    # Two middlewares over one store stand for two processes: nothing live to follow.
    app, client = make_client()
    _, other = make_client()
    async with client, other:
        original = asyncio.create_task(client.post("/slow", headers=keyed("k-slow")))
        await asyncio.wait_for(app.state.started.wait(), 10)
        duplicate = await asyncio.wait_for(other.post("/slow", headers=keyed("k-slow")), 5)
        assert not original.done()
        document = problem(duplicate, 409)
        assert duplicate.headers["retry-after"] == "1"
        assert document["idempotencyKey"] == "k-slow"
        app.state.gate.set()
        first = await original
        assert first.status_code == 200
        assert calls(app, "slow") == 1


async def test_patch_is_covered_and_put_is_not_by_default(app_client: AppClient) -> None:
    app, client = app_client
    await client.patch("/orders/7", json={"qty": 1}, headers=keyed("k-patch"))
    replay = await client.patch("/orders/7", json={"qty": 1}, headers=keyed("k-patch"))
    assert replay.headers["idempotent-replayed"] == "true"
    await client.put("/orders/7", json={"qty": 1}, headers=keyed("k-put"))
    await client.put("/orders/7", json={"qty": 1}, headers=keyed("k-put"))
    assert calls(app, "update_order") == 3


async def test_methods_option_selects_the_methods(make_client: Callable[..., Any]) -> None:
    app, client = make_client(methods=["PUT"])
    async with client:
        await client.put("/orders/7", json={}, headers=keyed("k-m"))
        await client.put("/orders/7", json={}, headers=keyed("k-m"))
        await client.post("/orders", json={}, headers=keyed("k-m"))
        await client.post("/orders", json={}, headers=keyed("k-m"))
    assert calls(app, "update_order") == 1
    assert calls(app, "create_order") == 2


async def test_safe_methods_pass_through_with_a_key(app_client: AppClient) -> None:
    app, client = app_client
    await client.get("/orders", headers=keyed("k-get"))
    await client.get("/orders", headers=keyed("k-get"))
    assert calls(app, "list_orders") == 2


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"with \\"quotes\\" and \\\\ slash"', 'with "quotes" and \\ slash'),
        ('  "padded"  ', "padded"),
        ('"key";v=1', "key"),
        ("token:with/chars", "token:with/chars"),
    ],
)
def test_key_is_parsed_as_sf_string_or_bare_token(value: str, key: str) -> None:
    assert parse_idempotency_key(value) == key


@pytest.mark.parametrize(
    "value",
    ['"unterminated', '"bad \\n escape"', '"tab\tinside"', "", "two words", '"a" junk', "a,b"],
)
def test_malformed_key_is_rejected(value: str) -> None:
    with pytest.raises(ValueError):
        parse_idempotency_key(value)


@pytest.mark.parametrize(
    "value",
    ['"unterminated', '""', '"' + "x" * 256 + '"', "a b"],
    ids=["syntax", "empty", "long", "space"],
)
async def test_invalid_key_is_400_and_does_not_run(app_client: AppClient, value: str) -> None:
    app, client = app_client
    response = await client.post("/orders", json={}, headers={**ALICE, "Idempotency-Key": value})
    problem(response, 400)
    assert calls(app, "create_order") == 0


async def test_two_key_fields_are_400(app_client: AppClient) -> None:
    app, client = app_client
    headers = [
        ("Authorization", ALICE["Authorization"]),
        ("Idempotency-Key", '"a"'),
        ("Idempotency-Key", '"b"'),
    ]
    problem(await client.post("/orders", json={}, headers=headers), 400)
    assert calls(app, "create_order") == 0


async def test_bare_token_key_replays_like_the_quoted_one(app_client: AppClient) -> None:
    app, client = app_client
    await client.post("/orders", json={}, headers={**ALICE, "Idempotency-Key": "bare-1"})
    again = await client.post("/orders", json={}, headers={**ALICE, "Idempotency-Key": '"bare-1"'})
    assert again.headers["idempotent-replayed"] == "true"
    assert calls(app, "create_order") == 1


async def test_callers_with_other_credentials_never_share_records(app_client: AppClient) -> None:
    app, client = app_client
    alice = await client.post("/orders", json={"sku": "A1"}, headers=keyed("same", ALICE))
    bob = await client.post("/orders", json={"sku": "A1"}, headers=keyed("same", BOB))
    assert "idempotent-replayed" not in bob.headers
    assert alice.json()["id"] != bob.json()["id"]
    # Bob reusing "his" key with another body is a conflict only within his own records.
    problem(await client.post("/orders", json={"sku": "B"}, headers=keyed("same", BOB)), 422)
    assert calls(app, "create_order") == 2


async def test_keyed_request_without_credentials_is_refused_by_default(
    app_client: AppClient,
) -> None:
    app, client = app_client
    document = problem(
        await client.post("/orders", json={}, headers={"Idempotency-Key": '"anon"'}), 400
    )
    assert "caller" in document["detail"]
    assert calls(app, "create_order") == 0


async def assert_callers_told_apart_by(
    app: Starlette, client: httpx.AsyncClient, header: str, caller: str, other: str
) -> None:
    """One key sent as ``caller``, as ``other``, then as ``caller`` again (``header`` names
    each): ``caller``'s retry replays its own answer, ``other`` ran a call of its own."""

    async def post_as(who: str) -> httpx.Response:
        return await client.post("/orders", json={}, headers={header: who, "Idempotency-Key": "k"})

    first = await post_as(caller)
    theirs = await post_as(other)
    again = await post_as(caller)
    assert_replay_of(again, first)
    assert theirs.content != first.content
    assert calls(app, "create_order") == 2


async def test_caller_callable_decides_the_caller(make_client: Callable[..., Any]) -> None:
    async def tenant(scope: Any) -> str | None:
        for name, value in scope["headers"]:
            if name == b"x-tenant":
                return str(value.decode())
        return None

    app, client = make_client(caller=tenant)
    async with client:
        await assert_callers_told_apart_by(app, client, "X-Tenant", "t1", "t2")


async def test_the_authenticated_user_is_the_caller_by_default(store: IdempotencyStore) -> None:
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware.authentication import AuthenticationMiddleware

    class HeaderAuth(AuthenticationBackend):
        async def authenticate(self, conn: Any) -> Any:
            user = conn.headers.get("x-user")
            return (AuthCredentials(["authenticated"]), SimpleUser(user)) if user else None

    app = create_app("starlette", store)
    # Added last, so it runs first and the idempotency middleware sees scope["user"].
    app.add_middleware(AuthenticationMiddleware, backend=HeaderAuth())
    async with client_of(app) as client:
        await assert_callers_told_apart_by(app, client, "X-User", "carol", "dave")


async def test_server_errors_are_not_recorded_by_default(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/server-error", "k-5xx")
    assert first.status_code == again.status_code == 503
    assert "idempotent-replayed" not in again.headers
    assert calls(app, "server_error") == 2


async def test_server_errors_are_recorded_when_asked(make_client: Callable[..., Any]) -> None:
    app, client = make_client(record_server_errors=True)
    async with client:
        first, again = await post_twice(client, "/server-error", "k-5xx")
    assert_replay_of(again, first)
    assert calls(app, "server_error") == 1


async def test_client_errors_are_recorded(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/declined", "k-4xx")
    assert first.status_code == again.status_code == 402
    assert_replay_of(again, first)
    assert calls(app, "declined") == 1


async def test_crash_releases_the_key(framework: str, store: IdempotencyStore) -> None:
    app = create_app(framework, store)
    async with client_of(app, raise_app_exceptions=False) as client:
        first, again = await post_twice(client, "/crash", "k-crash")
    assert first.status_code == again.status_code == 500
    assert calls(app, "crash") == 2


async def test_a_response_over_the_limit_runs_once_and_its_retries_are_refused(
    make_client: Callable[..., Any],
) -> None:
    app, client = make_client(max_response_bytes=1000)
    async with client:
        first = await client.post("/big?size=5000", headers=keyed("k-big"))
        again = await client.post("/big?size=5000", headers=keyed("k-big"))
        small = await client.post("/big?size=10", headers=keyed("k-small"))
        small_again = await client.post("/big?size=10", headers=keyed("k-small"))
    assert len(first.content) == 5001 and first.content.endswith(b"x" * 5000)
    document = problem(again, 409)
    assert document["type"].endswith("#outcome_unrecorded")
    assert "5001 bytes" in document["detail"] and "1000 bytes" in document["detail"]
    assert "retry-after" not in again.headers
    assert_replay_of(small_again, small)
    assert calls(app, "big") == 2


async def test_on_unrecorded_run_releases_the_key_of_a_response_over_the_limit(
    make_client: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    app, client = make_client(max_response_bytes=1000, on_unrecorded="run")
    async with client:
        with caplog.at_level(logging.WARNING, logger="idemstore.http.asgi"):
            first = await client.post("/big?size=5000", headers=keyed("k-big"))
        again = await client.post("/big?size=5000", headers=keyed("k-big"))
    assert first.status_code == again.status_code == 200
    assert "idempotent-replayed" not in again.headers
    assert any("key released" in record.getMessage() for record in caplog.records)
    assert calls(app, "big") == 2


def test_on_unrecorded_takes_refuse_or_run(store: IdempotencyStore) -> None:
    with pytest.raises(ConfigurationError, match="on_unrecorded"):
        IdempotencyMiddleware(create_app("starlette", store), store=store, on_unrecorded="rerun")  # type: ignore[arg-type]


async def test_streaming_response_within_the_limit_is_recorded(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/stream", "k-stream")
    assert first.text.count("chunk") == 5
    assert_replay_of(again, first)
    assert calls(app, "stream") == 1


async def test_an_event_stream_is_recorded_and_replayed(app_client: AppClient) -> None:
    app, client = app_client
    first, again = await post_twice(client, "/events", "k-sse")
    assert first.text == "data: execution 1\n\n"
    assert_replay_of(again, first)
    assert again.headers["content-type"].startswith("text/event-stream")
    assert calls(app, "events") == 1


async def test_request_body_over_the_limit_is_413(make_client: Callable[..., Any]) -> None:
    app, client = make_client(max_body_bytes=100)
    async with client:
        problem(await client.post("/upload", content=b"x" * 101, headers=keyed("k-413")), 413)
        ok = await client.post("/upload", content=b"x" * 100, headers=keyed("k-100"))
    assert ok.text.startswith("100 bytes")
    assert calls(app, "upload") == 1


async def test_outcome_past_retention_runs_again(framework: str) -> None:
    from idemstore.backends.memory import MemoryStore

    clock = FakeClock(1_000_000.0)
    app = create_app(framework, MemoryStore(clock=clock), retention=60)
    async with client_of(app) as client:
        await client.post("/orders", json={}, headers=keyed("k-ret"))
        clock.advance(61)
        again = await client.post("/orders", json={}, headers=keyed("k-ret"))
    assert "idempotent-replayed" not in again.headers
    assert calls(app, "create_order") == 2


def test_bad_options_are_configuration_errors(store: IdempotencyStore) -> None:
    from idemstore.errors import ConfigurationError

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError

    with pytest.raises(ConfigurationError):
        IdempotencyMiddleware(app, store=store, max_body_bytes=-1)
    with pytest.raises(ConfigurationError):
        IdempotencyMiddleware(app, store=store, retention=0)
    with pytest.raises(ConfigurationError):
        IdempotencyMiddleware(app, store=store, caller="not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        IdempotencyMiddleware(app, store=store, caller_sources=["cookie:*"])


async def test_unreachable_store_is_503_without_running(framework: str) -> None:
    from idemstore.backends.memory import MemoryStore
    from idemstore.errors import StoreUnavailableError

    class DownStore(MemoryStore):
        async def reserve(self, *args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("engine down")

    app = create_app(framework, DownStore())
    async with client_of(app) as client:
        response = await client.post("/orders", json={}, headers=keyed("k-down"))
        problem(response, 503)
        assert response.headers["retry-after"] == "1"
    assert calls(app, "create_order") == 0
