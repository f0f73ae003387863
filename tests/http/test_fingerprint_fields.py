"""Choosing what the request fingerprint covers, through the ASGI middleware and a real client:
a retry that differs only in a left-out field replays; one that differs in a covered one is
a 422."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.asgi import IdempotencyMiddleware
from idemstore.errors import ConfigurationError
from tests.http.conftest import ALICE, assert_ran_once_replayed_and_refused, calls, keyed

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore


async def test_a_retry_differing_only_in_an_excluded_field_replays(
    make_client: Callable[..., Any],
) -> None:
    app, client = make_client(fingerprint_exclude=["/meta/sent_at", "/trace_id"])
    key = uuid.uuid4().hex
    async with client:
        first = await client.post(
            "/orders",
            headers=keyed(key),
            json={"item": "tea", "meta": {"sent_at": 1}, "trace_id": "a"},
        )
        again = await client.post(
            "/orders",
            headers=keyed(key),
            json={"item": "tea", "meta": {"sent_at": 2}, "trace_id": "b"},
        )
        other = await client.post(
            "/orders", headers=keyed(key), json={"item": "coffee", "meta": {"sent_at": 3}}
        )
    assert first.status_code == 201
    assert_ran_once_replayed_and_refused(app, "create_order", first, again, other)


async def test_only_included_fields_decide_and_a_change_there_is_a_422(
    make_client: Callable[..., Any],
) -> None:
    app, client = make_client(fingerprint_include=["/item", "/amount"])
    key = uuid.uuid4().hex
    async with client:
        first = await client.post(
            "/orders", headers=keyed(key), json={"item": "tea", "amount": 3, "note": "x"}
        )
        again = await client.post(
            "/orders", headers=keyed(key), json={"item": "tea", "amount": 3, "note": "y"}
        )
        changed = await client.post(
            "/orders", headers=keyed(key), json={"item": "tea", "amount": 4, "note": "x"}
        )
    assert_ran_once_replayed_and_refused(app, "create_order", first, again, changed)


async def test_a_named_header_joins_the_fingerprint(make_client: Callable[..., Any]) -> None:
    app, client = make_client(fingerprint_headers=["X-Tenant"])
    key = uuid.uuid4().hex
    async with client:
        first = await client.post(
            "/orders", headers=keyed(key, {**ALICE, "X-Tenant": "t1"}), json={"item": "tea"}
        )
        again = await client.post(
            "/orders", headers=keyed(key, {**ALICE, "X-Tenant": "t1"}), json={"item": "tea"}
        )
        other = await client.post(
            "/orders", headers=keyed(key, {**ALICE, "X-Tenant": "t2"}), json={"item": "tea"}
        )
    assert_ran_once_replayed_and_refused(app, "create_order", first, again, other)


async def test_a_body_that_is_not_json_counts_whole_whatever_is_excluded(
    make_client: Callable[..., Any],
) -> None:
    app, client = make_client(fingerprint_exclude=["/sent_at"])
    key = uuid.uuid4().hex
    async with client:
        await client.post("/upload", headers=keyed(key), data={"a": "1", "sent_at": "1"})
        other = await client.post("/upload", headers=keyed(key), data={"a": "1", "sent_at": "2"})
    assert other.status_code == 422
    assert calls(app, "upload") == 1


async def test_without_a_selection_the_whole_body_still_counts(
    make_client: Callable[..., Any],
) -> None:
    _, client = make_client()
    key = uuid.uuid4().hex
    async with client:
        await client.post("/orders", headers=keyed(key), json={"item": "tea", "trace_id": "a"})
        other = await client.post(
            "/orders", headers=keyed(key), json={"item": "tea", "trace_id": "b"}
        )
    assert other.status_code == 422


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fingerprint_exclude": ["trace_id"]}, "start it with /"),
        ({"fingerprint_exclude": "/trace_id"}, "list of JSON pointers"),
        ({"fingerprint_include": ["/a"], "fingerprint_exclude": ["/b"]}, "not both"),
        ({"fingerprint_headers": ["X Tenant"]}, "not an HTTP header name"),
        ({"fingerprint_headers": ["Idempotency-Key"]}, "the key itself"),
    ],
)
def test_a_bad_selection_is_refused_when_the_middleware_is_built(
    store: IdempotencyStore, options: dict[str, Any], message: str
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(ConfigurationError, match=message):
        IdempotencyMiddleware(app, store=store, **options)
