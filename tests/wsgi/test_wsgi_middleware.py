"""The WSGI middleware answers as the ASGI one does, around a Flask app, on real engines."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from werkzeug.test import Client

from idemstore.errors import ConfigurationError
from idemstore.http.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.http.wsgi import IdempotencyMiddleware
from tests.wsgi.apps import orders_app

if TYPE_CHECKING:
    from collections.abc import Iterator

    import flask

ALICE = {"Authorization": "Bearer alice"}


def keyed(key: str | None = None, **more: str) -> dict[str, str]:
    return {**ALICE, "Idempotency-Key": f'"{key or uuid.uuid4().hex}"', **more}


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_store_url"))


@contextlib.contextmanager
def orders_behind_middleware(store_url: str, **options: Any) -> Iterator[flask.Flask]:
    """The orders app with the WSGI middleware (given ``options``) in front of it."""
    flask_app = orders_app()
    with IdempotencyMiddleware(flask_app.wsgi_app, store=store_url, **options) as middleware:
        flask_app.wsgi_app = middleware  # type: ignore[method-assign]
        yield flask_app


@pytest.fixture
def app(store_url: str) -> Iterator[flask.Flask]:
    with orders_behind_middleware(store_url) as flask_app:
        yield flask_app


def test_a_retry_gets_the_recorded_response_marked_replayed(app: flask.Flask) -> None:
    client = Client(app)
    headers = keyed()
    first = client.post("/orders", json={"item": "tea"}, headers=headers)
    again = client.post("/orders", json={"item": "tea"}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.get_json() == again.get_json() == {"order": {"item": "tea"}, "number": 1}
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert app.config["count"] == 1


def test_same_body_in_another_key_order_is_the_same_request(app: flask.Flask) -> None:
    client = Client(app)
    headers = {**keyed(), "Content-Type": "application/json"}
    client.post("/orders", data='{"a": 1, "b": 2}', headers=headers)
    again = client.post("/orders", data='{"b":2,"a":1}', headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"


def test_the_key_reused_for_another_request_is_a_422(app: flask.Flask) -> None:
    client = Client(app)
    headers = keyed()
    client.post("/orders", json={"item": "tea"}, headers=headers)
    other = client.post("/orders", json={"item": "coffee"}, headers=headers)
    assert other.status_code == 422
    assert other.headers["Content-Type"] == "application/problem+json"
    assert app.config["count"] == 1


def test_a_duplicate_while_the_original_runs_follows_it(store_url: str) -> None:
    running, finish = threading.Event(), threading.Event()
    runs: list[int] = []

    def slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        runs.append(1)
        running.set()
        finish.wait()
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"made"]

    headers = keyed()
    with IdempotencyMiddleware(slow, store=store_url) as wrapped:
        answers: dict[str, Any] = {}

        def post(name: str) -> None:
            answers[name] = Client(wrapped).post("/orders", json={}, headers=headers)

        original = threading.Thread(target=post, args=("original",))
        original.start()
        running.wait()
        duplicate = threading.Thread(target=post, args=("duplicate",))
        duplicate.start()
        duplicate.join(0.2)
        assert duplicate.is_alive()  # following the original (in this process), not refused
        finish.set()
        original.join()
        duplicate.join()
    first, followed = answers["original"], answers["duplicate"]
    assert first.status_code == followed.status_code == 201
    assert first.data == followed.data == b"made"
    assert followed.headers["Idempotent-Replayed"] == "true"
    assert runs == [1]


def test_concurrent_duplicates_from_threads_run_the_effect_once(app: flask.Flask) -> None:
    headers = keyed()
    barrier = threading.Barrier(8)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        statuses.append(Client(app).post("/orders", json={}, headers=headers).status_code)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert app.config["count"] == 1
    assert set(statuses) <= {201, 409} and 201 in statuses


def test_an_anonymous_keyed_request_is_refused_not_matched(app: flask.Flask) -> None:
    refused = Client(app).post("/orders", json={}, headers={"Idempotency-Key": '"k"'})
    assert refused.status_code == 400
    assert "caller" in refused.get_json()["title"]
    assert app.config["count"] == 0


def test_remote_user_is_the_caller_when_configured(store_url: str) -> None:
    with orders_behind_middleware(store_url, trust_remote_user=True) as app:
        client = Client(app)
        headers = {"Idempotency-Key": '"same"'}
        for user in ("alice", "bob", "alice"):
            response = client.post(
                "/orders", json={}, headers=headers, environ_overrides={"REMOTE_USER": user}
            )
            assert response.status_code == 201
        assert response.headers["Idempotent-Replayed"] == "true"
        assert app.config["count"] == 2  # alice's retry replayed


def test_remote_user_is_no_caller_unless_configured(app: flask.Flask) -> None:
    # A WSGI server may pass a client-controlled REMOTE_USER: by default it names nobody.
    response = Client(app).post(
        "/orders",
        json={},
        headers={"Idempotency-Key": '"k"'},
        environ_overrides={"REMOTE_USER": "1"},
    )
    assert response.status_code == 400


# Issue #40, case 3: present, but they identify nobody.
NAMES_NOBODY = {
    "bare-bearer": {"Authorization": "Bearer"},
    "basic-alone": {"Authorization": "Basic"},
    "empty-session-cookie": {"Cookie": "session="},
    "constant-consent-cookie": {"Cookie": "consent=yes"},
}


@pytest.mark.parametrize("credentials", NAMES_NOBODY.values(), ids=NAMES_NOBODY.keys())
def test_credentials_that_name_nobody_are_refused(
    app: flask.Flask, credentials: dict[str, str]
) -> None:

    def post_as_someone() -> Any:
        client, headers = Client(app), {"Idempotency-Key": '"k"'}
        for name, value in credentials.items():
            if name == "Cookie":  # the test client sends its own cookie jar, not the header
                client.set_cookie(*value.split("=", 1))
            else:
                headers[name] = value
        return client.post("/orders", json={}, headers=headers)

    first = post_as_someone()  # one person
    second = post_as_someone()  # another
    assert first.status_code == second.status_code == 400
    assert "caller" in second.get_json()["detail"]
    assert app.config["count"] == 0


def test_callers_never_see_each_other_s_records(app: flask.Flask) -> None:
    client = Client(app)
    key = '"shared-key"'
    client.post("/orders", json={}, headers={"Idempotency-Key": key, **ALICE})
    bob = client.post(
        "/orders", json={}, headers={"Idempotency-Key": key, "Authorization": "Bearer bob"}
    )
    assert "Idempotent-Replayed" not in bob.headers
    assert app.config["count"] == 2


def test_requests_without_a_key_or_of_other_methods_pass_through(app: flask.Flask) -> None:
    client = Client(app)
    client.post("/orders", json={}, headers=ALICE)
    client.post("/orders", json={}, headers=ALICE)
    assert client.get("/orders", headers=keyed()).get_json() == {"count": 2}


def test_a_bad_key_is_a_400_and_nothing_runs(app: flask.Flask) -> None:
    response = Client(app).post(
        "/orders", json={}, headers={**ALICE, "Idempotency-Key": '"unterminated'}
    )
    assert response.status_code == 400
    assert app.config["count"] == 0


def test_a_body_over_the_limit_is_a_413(store_url: str) -> None:
    flask_app = orders_app()
    with IdempotencyMiddleware(flask_app.wsgi_app, store=store_url, max_body_bytes=8) as wrapped:
        response = Client(wrapped).post("/orders", data=b"x" * 9, headers=keyed())
    assert response.status_code == 413
    assert flask_app.config["count"] == 0


def test_an_app_that_raises_releases_the_key_and_the_error_propagates(store_url: str) -> None:
    calls: list[int] = []

    def raising(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls.append(1)
        raise RuntimeError("the app failed")

    with IdempotencyMiddleware(raising, store=store_url) as wrapped:
        client = Client(wrapped)
        headers = keyed()
        for _ in range(2):
            with pytest.raises(RuntimeError, match="the app failed"):
                client.post("/orders", json={}, headers=headers)
    assert calls == [1, 1]


def test_server_errors_are_not_recorded(app: flask.Flask) -> None:
    client = Client(app)
    headers = keyed()
    statuses = [client.post("/broken", json={}, headers=headers).status_code for _ in range(2)]
    assert statuses == [503, 503]
    assert app.config["count"] == 2


def test_a_key_is_required_where_the_predicate_says(store_url: str) -> None:
    flask_app = orders_app()

    def needs_key(environ: dict[str, Any]) -> bool:
        return bool(environ["PATH_INFO"] == "/orders")

    with IdempotencyMiddleware(flask_app.wsgi_app, store=store_url, required=needs_key) as wrapped:
        missing = Client(wrapped).post("/orders", json={}, headers=ALICE)
        other = Client(wrapped).post("/broken", json={}, headers=ALICE)
    assert missing.status_code == 400 and "required" in missing.get_json()["title"]
    assert other.status_code == 503


def test_a_caller_callable_is_given_the_environ(store_url: str) -> None:
    flask_app = orders_app()

    def tenant(environ: dict[str, Any]) -> str | None:
        return environ.get("HTTP_X_TENANT")

    with IdempotencyMiddleware(flask_app.wsgi_app, store=store_url, caller=tenant) as wrapped:
        client = Client(wrapped)
        client.post("/orders", json={}, headers={"Idempotency-Key": "k", "X-Tenant": "a"})
        again = client.post("/orders", json={}, headers={"Idempotency-Key": "k", "X-Tenant": "a"})
        anonymous = client.post("/orders", json={}, headers={"Idempotency-Key": "k"})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert anonymous.status_code == 400


def test_a_bad_option_fails_in_the_constructor() -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyMiddleware(orders_app().wsgi_app, store="memory://", methods=())
    with pytest.raises(ConfigurationError, match="unknown store scheme"):
        IdempotencyMiddleware(orders_app().wsgi_app, store="nosuch://x")


def test_the_forwarded_options_are_checked_by_the_asgi_middleware_and_misspelt_ones_named() -> None:
    with pytest.raises(ConfigurationError, match="max_body_bytes"):
        IdempotencyMiddleware(orders_app().wsgi_app, store="memory://", max_body_bytes=-1)
    with pytest.raises(TypeError, match=r"unknown options \['retension'\]"):
        IdempotencyMiddleware(orders_app().wsgi_app, store="memory://", retension=5)  # type: ignore[call-arg]
    with IdempotencyMiddleware(orders_app().wsgi_app, store="memory://") as wrapped:
        assert wrapped.max_body_bytes == 1024 * 1024


def test_an_asgi_deployment_replays_what_the_wsgi_one_recorded(redis_store_url: str) -> None:
    flask_app = orders_app()
    headers = keyed()
    with IdempotencyMiddleware(flask_app.wsgi_app, store=redis_store_url) as wrapped:
        first = Client(wrapped).post("/orders", json={"item": "tea"}, headers=headers)

    async def never_runs(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the ASGI app ran a recorded request")

    async def replay() -> httpx.Response:
        middleware = ASGIIdempotencyMiddleware(never_runs, store=redis_store_url)
        transport = httpx.ASGITransport(app=middleware)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.post("/orders", json={"item": "tea"}, headers=headers)
        finally:
            await middleware.close()

    replayed = asyncio.run(replay())
    assert replayed.status_code == 201
    assert replayed.headers["idempotent-replayed"] == "true"
    assert replayed.json() == first.get_json()


def test_a_retry_differing_only_in_an_excluded_field_replays(store_url: str) -> None:
    with orders_behind_middleware(store_url, fingerprint_exclude=["/sent_at"]) as flask_app:
        client, headers = Client(flask_app), keyed()
        first = client.post("/orders", json={"item": "tea", "sent_at": 1}, headers=headers)
        again = client.post("/orders", json={"item": "tea", "sent_at": 2}, headers=headers)
        other = client.post("/orders", json={"item": "cake", "sent_at": 2}, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json() == first.get_json()
    assert other.status_code == 422
    assert flask_app.config["count"] == 1


def test_a_change_in_an_included_field_is_a_422(store_url: str) -> None:
    with orders_behind_middleware(store_url, fingerprint_include=["/item"]) as flask_app:
        client, headers = Client(flask_app), keyed()
        client.post("/orders", json={"item": "tea", "note": "a"}, headers=headers)
        again = client.post("/orders", json={"item": "tea", "note": "b"}, headers=headers)
        other = client.post("/orders", json={"item": "cake", "note": "a"}, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    assert flask_app.config["count"] == 1


def test_a_bad_fingerprint_pointer_is_refused_by_the_constructor() -> None:
    with pytest.raises(ConfigurationError, match="start it with /"):
        IdempotencyMiddleware(orders_app().wsgi_app, store="memory://", fingerprint_exclude=["x"])
