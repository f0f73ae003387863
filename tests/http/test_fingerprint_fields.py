"""Choosing what the request fingerprint covers, through the ASGI middleware and a real client:
a retry that differs only in a left-out field replays; one that differs in a covered one is
a 422."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.errors import ConfigurationError
from idemstore.http.asgi import IdempotencyMiddleware
from tests.http.conftest import ALICE, assert_ran_once_replayed_and_refused, calls, keyed

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore


# Per selection: the middleware's options, then three requests under one key as (extra
# headers, JSON body): the first, a retry differing only outside the selection, and one
# differing inside it.
SELECTIONS = {
    "excluded-fields": (
        {"fingerprint_exclude": ["/meta/sent_at", "/trace_id"]},
        ({}, {"item": "tea", "meta": {"sent_at": 1}, "trace_id": "a"}),
        ({}, {"item": "tea", "meta": {"sent_at": 2}, "trace_id": "b"}),
        ({}, {"item": "coffee", "meta": {"sent_at": 3}}),
    ),
    "included-fields": (
        {"fingerprint_include": ["/item", "/amount"]},
        ({}, {"item": "tea", "amount": 3, "note": "x"}),
        ({}, {"item": "tea", "amount": 3, "note": "y"}),
        ({}, {"item": "tea", "amount": 4, "note": "x"}),
    ),
    "named-header": (
        {"fingerprint_headers": ["X-Tenant"]},
        ({"X-Tenant": "t1"}, {"item": "tea"}),
        ({"X-Tenant": "t1"}, {"item": "tea"}),
        ({"X-Tenant": "t2"}, {"item": "tea"}),
    ),
}


@pytest.mark.parametrize("selection", list(SELECTIONS))
async def test_a_retry_differing_only_outside_the_selection_replays_and_one_inside_is_a_422(
    make_client: Callable[..., Any], selection: str
) -> None:
    options, *requests = SELECTIONS[selection]
    app, client = make_client(**options)
    key = uuid.uuid4().hex
    async with client:
        first, again, changed = [
            await client.post("/orders", headers=keyed(key, {**ALICE, **extra}), json=body)
            for extra, body in requests
        ]
    assert first.status_code == 201
    assert_ran_once_replayed_and_refused(app, "create_order", first, again, changed)


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
