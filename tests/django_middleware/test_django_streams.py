"""Issue 42 through Django's test client: a ``StreamingHttpResponse`` of a keyed request is
sent on as the view produces it, recorded on the way, and replayed byte for byte."""

from __future__ import annotations

import uuid

import pytest
from django.test import AsyncClient, Client

from tests.django_middleware.project import EFFECTS, PRODUCED

pytestmark = pytest.mark.usefixtures("idemstore_settings")


def keyed(key: str) -> dict[str, str]:
    return {"X-Test-User": "alice", "Idempotency-Key": f'"{key}"'}


def test_a_streaming_response_is_sent_as_produced_and_replayed_byte_identical() -> None:
    client, headers = Client(), keyed(uuid.uuid4().hex)
    PRODUCED.clear()
    first = client.post("/ticks?events=50", headers=headers)
    assert first.streaming
    chunks = iter(first.streaming_content)
    received = [next(chunks)]
    assert len(PRODUCED) < 50  # the client has the first event before the view made the last
    received.extend(chunks)
    body = b"".join(received)
    assert body.count(b"\n\n") == 50 and len(PRODUCED) == 50
    again = client.post("/ticks?events=50", headers=headers)
    assert again.content == body
    assert again.headers["Content-Type"] == first.headers["Content-Type"] == "text/event-stream"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert EFFECTS == {"ticks": 1}


async def test_an_async_streaming_response_is_sent_as_produced_and_replayed() -> None:
    client, headers = AsyncClient(), keyed(uuid.uuid4().hex)
    PRODUCED.clear()
    first = await client.post("/async-ticks?events=50", headers=headers)
    assert first.streaming
    received = [chunk async for chunk in first.streaming_content]
    assert len(received) > 1
    body = b"".join(received)
    assert body.count(b"\n\n") == 50
    again = await client.post("/async-ticks?events=50", headers=headers)
    assert again.content == body
    assert again.headers["Idempotent-Replayed"] == "true"
    assert EFFECTS == {"async_ticks": 1}
