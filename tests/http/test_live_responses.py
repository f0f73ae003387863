"""Issue 42: a retry that arrives while the original's response is being produced in this
process follows it from its first byte, bounded by the recording limit, and never slows the
original's client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idemstore import open_store
from idemstore.http.asgi import IdempotencyMiddleware
from idemstore.http.live import ResponseCut

CHUNKS = 20
KEYED: list[tuple[bytes, bytes]] = [
    (b"idempotency-key", b'"live-1"'),
    (b"authorization", b"Bearer alice"),
]


def scope() -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/feed", "headers": KEYED}


async def request_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class Feed:
    """An ASGI app streaming CHUNKS chunks of ``size`` bytes, one per item put in ``steps``."""

    def __init__(self, size: int = 10) -> None:
        self.size = size
        self.runs = 0
        self.steps: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.runs += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(CHUNKS):
            await self.steps.get()
            body = bytes([65 + i % 26]) * self.size
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Client:
    """An ASGI ``send`` that collects the body, each message taking ``delay`` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.body = b""
        self.started = asyncio.Event()
        self.headers: list[tuple[bytes, bytes]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        if message["type"] == "http.response.start":
            self.headers = list(message["headers"])
            self.started.set()
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


async def drive(feed: Feed) -> None:
    """Let the app produce all its chunks as fast as its own client takes them."""
    for _ in range(CHUNKS):
        feed.steps.put_nowait(None)


async def test_a_slow_follower_never_slows_the_original_and_gets_every_byte() -> None:
    feed = Feed()
    middleware = IdempotencyMiddleware(feed, store=open_store("memory://"))
    fast, slow = Client(), Client(delay=0.05)
    original = asyncio.create_task(middleware(scope(), request_body, fast))
    await asyncio.wait_for(fast.started.wait(), 5)
    follower = asyncio.create_task(middleware(scope(), request_body, slow))
    await asyncio.wait_for(slow.started.wait(), 5)
    await drive(feed)
    await asyncio.wait_for(original, 5)
    # The original's client got all of it while the follower's (50 ms a message) had at most
    # half: paced by the follower, the original would end with it a chunk or so behind. An
    # order, not a time: on a loaded machine the original may take a while, just not 0.5 s.
    assert len(fast.body) == CHUNKS * 10
    assert len(slow.body) <= len(fast.body) // 2 and not follower.done()
    await asyncio.wait_for(follower, 5)
    assert slow.body == fast.body
    assert (b"idempotent-replayed", b"true") in slow.headers
    assert feed.runs == 1


async def test_a_follower_is_cut_when_the_response_outgrows_the_recording_limit() -> None:
    feed = Feed(size=100)
    middleware = IdempotencyMiddleware(feed, store=open_store("memory://"), max_response_bytes=1000)
    client, late = Client(), Client()
    original = asyncio.create_task(middleware(scope(), request_body, client))
    await asyncio.wait_for(client.started.wait(), 5)
    follower = asyncio.create_task(middleware(scope(), request_body, late))
    await asyncio.wait_for(late.started.wait(), 5)
    await drive(feed)
    await asyncio.wait_for(original, 5)
    assert len(client.body) == CHUNKS * 100
    # Memory stays bounded by the limit: past it the copy is dropped, and so is the follower
    # (its server closes the connection: its response never looks complete).
    with pytest.raises(ResponseCut):
        await asyncio.wait_for(follower, 5)
    assert len(late.body) <= 1000
    assert feed.runs == 1


async def trailed(scope: Any, receive: Any, send: Any) -> None:
    """An app whose response has trailers (a checksum after the body)."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.body", "body": b"payload", "more_body": False})
    await send({"type": "http.response.trailers", "headers": [(b"x-sum", b"1")]})


async def test_a_response_with_trailers_is_sent_once_and_its_retries_are_refused() -> None:
    middleware = IdempotencyMiddleware(trailed, store=open_store("memory://"))
    first, again = Client(), Client()
    await middleware(scope(), request_body, first)
    await middleware(scope(), request_body, again)
    assert first.body == b"payload"
    # Trailers cannot be recorded faithfully: the outcome-not-recorded rule, not a second run.
    assert b"outcome_unrecorded" in again.body
