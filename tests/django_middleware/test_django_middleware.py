"""The Django middleware answers as the ASGI one does, for sync and async views."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings

from idemstore.http.django import IdempotencyMiddleware, close_stores
from tests.django_middleware.project import EFFECTS

pytestmark = pytest.mark.usefixtures("idemstore_settings")

ALICE = {"X-Test-User": "alice"}


def keyed(key: str | None = None, **more: str) -> dict[str, str]:
    return {**ALICE, "Idempotency-Key": f'"{key or uuid.uuid4().hex}"', **more}


def post(client: Client, path: str, body: str, headers: dict[str, str]):  # type: ignore[no-untyped-def]
    return client.post(path, body, content_type="application/json", headers=headers)


def test_a_retry_of_a_sync_view_replays_its_response() -> None:
    client, headers = Client(), keyed()
    first = post(client, "/orders", '{"item": "tea"}', headers)
    again = post(client, "/orders", '{"item": "tea"}', headers)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"order": {"item": "tea"}, "n": 1}
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert EFFECTS == {"orders": 1}


async def test_a_retry_of_an_async_view_replays_its_response() -> None:
    client, headers = AsyncClient(), keyed()
    first = await client.post(
        "/async-orders", '{"a": 1}', content_type="application/json", headers=headers
    )
    again = await client.post(
        "/async-orders", '{"a": 1}', content_type="application/json", headers=headers
    )
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert EFFECTS == {"async_orders": 1}


def test_the_key_reused_for_another_request_is_a_422() -> None:
    client, headers = Client(), keyed()
    post(client, "/orders", '{"item": "tea"}', headers)
    other = post(client, "/orders", '{"item": "cake"}', headers)
    assert other.status_code == 422
    assert other.headers["Content-Type"] == "application/problem+json"
    assert EFFECTS == {"orders": 1}


def test_an_anonymous_keyed_request_is_refused() -> None:
    refused = post(Client(), "/orders", "{}", {"Idempotency-Key": '"k"'})
    assert refused.status_code == 400
    assert EFFECTS == {}


# Issue #40, case 3: present, but they identify nobody.
NAMES_NOBODY = {
    "bare-bearer": {"Authorization": "Bearer"},
    "basic-alone": {"Authorization": "Basic"},
    "empty-session-cookie": {"Cookie": "session="},
    "constant-consent-cookie": {"Cookie": "consent=yes"},
}


@pytest.mark.parametrize("credentials", NAMES_NOBODY.values(), ids=NAMES_NOBODY.keys())
def test_credentials_that_name_nobody_are_refused(credentials: dict[str, str]) -> None:
    headers = {**credentials, "Idempotency-Key": '"k"'}
    first = post(Client(), "/orders", "{}", headers)  # one person
    second = post(Client(), "/orders", "{}", headers)  # another
    assert first.status_code == second.status_code == 400
    assert "caller" in second.json()["detail"]
    assert EFFECTS == {}


def anonymous_with_remote_user(user: str):  # type: ignore[no-untyped-def]
    return Client().post(
        "/orders",
        "{}",
        content_type="application/json",
        headers={"Idempotency-Key": '"k"'},
        REMOTE_USER=user,
    )


def test_a_remote_user_is_no_caller_unless_configured() -> None:
    # Issue #40, case 6: Django user 1's record, then an anonymous request with REMOTE_USER=1.
    first = post(Client(), "/orders", "{}", {"Idempotency-Key": '"k"', "X-Test-User": "1"})
    anonymous = anonymous_with_remote_user("1")
    assert first.status_code == 201
    assert anonymous.status_code == 400
    assert EFFECTS == {"orders": 1}


async def test_an_async_view_reads_no_remote_user_unless_configured() -> None:
    client = AsyncClient()
    path, kind = "/async-orders", "application/json"
    user = {"Idempotency-Key": '"k"', "X-Test-User": "1"}
    first = await client.post(path, "{}", content_type=kind, headers=user)
    anonymous = await client.post(
        path, "{}", content_type=kind, headers={"Idempotency-Key": '"k"'}, REMOTE_USER="1"
    )
    assert first.status_code == 201
    assert anonymous.status_code == 400
    assert EFFECTS == {"async_orders": 1}


def test_a_trusted_remote_user_is_not_the_django_user_of_that_pk(store_url: str) -> None:
    with override_settings(IDEMSTORE={"STORE": store_url, "TRUST_REMOTE_USER": True}):
        first = post(Client(), "/orders", "{}", {"Idempotency-Key": '"k"', "X-Test-User": "1"})
        remote = anonymous_with_remote_user("1")
        again = anonymous_with_remote_user("1")
    assert first.status_code == remote.status_code == 201
    assert "Idempotent-Replayed" not in remote.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert EFFECTS == {"orders": 2}


def test_each_authenticated_user_has_their_own_keys() -> None:
    client = Client()
    for user in ("alice", "bob"):
        response = post(client, "/orders", "{}", {"Idempotency-Key": '"k"', "X-Test-User": user})
        assert "Idempotent-Replayed" not in response.headers
    assert EFFECTS == {"orders": 2}


def test_concurrent_duplicates_from_threads_run_the_view_once() -> None:
    headers = keyed()
    barrier = threading.Barrier(6)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        statuses.append(post(Client(), "/orders?sleep=0.2", "{}", headers).status_code)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert EFFECTS == {"orders": 1}
    assert set(statuses) <= {201, 409} and 201 in statuses


def test_a_view_marked_required_refuses_a_request_without_a_key() -> None:
    missing = post(Client(), "/payments", "{}", ALICE)
    assert missing.status_code == 400 and "required" in missing.json()["title"]
    assert post(Client(), "/payments", "{}", keyed()).status_code == 201
    assert EFFECTS == {"payments": 1}


def test_a_view_marked_exempt_runs_every_keyed_request() -> None:
    client, headers = Client(), keyed()
    post(client, "/pings", "{}", headers)
    again = post(client, "/pings", "{}", headers)
    assert "Idempotent-Replayed" not in again.headers
    assert EFFECTS == {"pings": 2}


def test_requests_without_a_key_pass_through() -> None:
    client = Client()
    post(client, "/orders", "{}", ALICE)
    post(client, "/orders", "{}", ALICE)
    assert EFFECTS == {"orders": 2}


def test_settings_path_patterns_require_a_key(store_url: str) -> None:
    with override_settings(IDEMSTORE={"STORE": store_url, "REQUIRED": ["/orders"]}):
        missing = post(Client(), "/orders", "{}", ALICE)
    assert missing.status_code == 400
    assert EFFECTS == {}


def test_a_caller_function_from_settings_is_given_the_request(store_url: str) -> None:
    caller = "tests.django_middleware.test_django_middleware.tenant_scope"
    with override_settings(IDEMSTORE={"STORE": store_url, "CALLER": caller}):
        client = Client()
        headers = {"Idempotency-Key": '"k"', "X-Tenant": "acme"}
        post(client, "/orders", "{}", headers)
        again = post(client, "/orders", "{}", headers)
    assert again.headers["Idempotent-Replayed"] == "true"


def tenant_scope(request: object) -> str | None:
    return getattr(request, "headers", {}).get("X-Tenant")


@pytest.mark.parametrize(
    ("configured", "says"),
    [
        ({}, "STORE"),
        ({"STORE": "memory://", "RETENTON": 5}, "unknown keys"),
        ({"STORE": "nosuch://x"}, "unknown store scheme"),
        ({"STORE": "memory://", "METHODS": []}, "at least one method"),
        ({"STORE": "memory://", "FINGERPRINT_EXCLUDE": ["sent_at"]}, "start it with /"),
        ({"STORE": "memory://", "FINGERPRINT_INCLUDE": "/item"}, "list of JSON pointers"),
    ],
)
def test_bad_settings_are_improperly_configured(configured: dict[str, object], says: str) -> None:
    with override_settings(IDEMSTORE=configured), pytest.raises(ImproperlyConfigured, match=says):
        IdempotencyMiddleware(lambda request: None)
    close_stores()


def test_a_required_predicate_from_settings_is_given_the_request(store_url: str) -> None:
    def orders_only(request: object) -> bool:
        return getattr(request, "path", "") == "/orders"

    with override_settings(IDEMSTORE={"STORE": store_url, "REQUIRED": orders_only}):
        missing = post(Client(), "/orders", "{}", ALICE)
        elsewhere = post(Client(), "/pings", "{}", ALICE)
    assert missing.status_code == 400
    assert elsewhere.status_code == 200


def test_settings_can_leave_a_body_field_out_of_the_fingerprint(store_url: str) -> None:
    settings = {"STORE": store_url, "FINGERPRINT_EXCLUDE": ["/meta/sent_at"]}
    with override_settings(IDEMSTORE=settings):
        client, headers = Client(), keyed()
        first = post(client, "/orders", '{"item": "tea", "meta": {"sent_at": 1}}', headers)
        again = post(client, "/orders", '{"item": "tea", "meta": {"sent_at": 2}}', headers)
        other = post(client, "/orders", '{"item": "cake", "meta": {"sent_at": 2}}', headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert other.status_code == 422
    assert EFFECTS == {"orders": 1}


async def test_settings_can_pick_the_fields_the_fingerprint_covers(store_url: str) -> None:
    settings = {"STORE": store_url, "FINGERPRINT_INCLUDE": ["/a"]}
    with override_settings(IDEMSTORE=settings):
        client, headers = AsyncClient(), keyed()
        path, kind = "/async-orders", "application/json"
        await client.post(path, '{"a": 1, "t": 1}', content_type=kind, headers=headers)
        again = await client.post(path, '{"a": 1, "t": 2}', content_type=kind, headers=headers)
        other = await client.post(path, '{"a": 2, "t": 1}', content_type=kind, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    assert EFFECTS == {"async_orders": 1}
