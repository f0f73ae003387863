"""The ``middleware`` scenario's streamed cases: what recording a streamed response costs, and
how soon a retry that follows a running original gets its first byte.

- ``streamed 1 MB``: a 1 MB response sent in 64 KiB chunks through ``IdempotencyMiddleware``
  (new key each request: passed on as produced and recorded) against the same app without it
  (passed straight through);
- ``follower first byte``: a retry of a request whose response has started and is still being
  produced: from the retry's call to its first body byte (read from the original's live copy),
  against the original's own call-to-first-byte through the middleware.

Cheap at default durations: a few dozen samples each, all in process over a memory store.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from idemstore.bench.results import Measurement, Timing

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from idemstore.bench.scenarios import Load

__all__ = ["STREAM_SAMPLES", "run_stream_probes"]

STREAM_SAMPLES = 40
STREAM_BYTES = 1_000_000
CHUNK = 64 * 1024
_STORE = "memory://"


async def _streamed(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """An ASGI endpoint streaming ``STREAM_BYTES`` in ``CHUNK``-sized body messages."""
    await receive()
    headers = [(b"content-type", b"application/octet-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    left, piece = STREAM_BYTES, b"s" * CHUNK
    while left > 0:
        chunk = piece[: min(CHUNK, left)]
        left -= len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})


class _Gated:
    """An endpoint that sends its start and a first chunk, then waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await self.gate.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})


def _scope(key: str | None) -> dict[str, Any]:
    headers = [(b"authorization", b"Bearer bench")]
    if key is not None:
        headers.append((b"idempotency-key", f'"{key}"'.encode()))
    return {"type": "http", "method": "POST", "path": "/stream", "headers": headers}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class _Client:
    """An ASGI ``send`` that notes when the first body byte arrived."""

    def __init__(self) -> None:
        self.first_byte = asyncio.Event()
        self.at = 0
        self.status = 0

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message.get("body") and not self.first_byte.is_set():
            self.at = time.perf_counter_ns()
            self.first_byte.set()


def _time(timing: Timing, begun: int, ended: int, ok: bool) -> None:
    timing.seconds += (ended - begun) / 1e9
    if ok:
        timing.latencies_ns.append(ended - begun)
    else:
        timing.record_error(RuntimeError("the request did not answer 200"))


async def run_stream_probes(load: Load, prefix: str) -> list[Measurement]:
    from idemstore.backends.urls import open_store
    from idemstore.http.asgi import IdempotencyMiddleware

    count = STREAM_SAMPLES if load.ops is None else max(1, min(STREAM_SAMPLES, load.ops))
    recorded, passed = Timing(), Timing()
    follower, original = Timing(), Timing()
    clock = time.perf_counter_ns
    async with open_store(_STORE) as store:
        wrapped = IdempotencyMiddleware(_streamed, store=store)
        for j in range(-2, count):  # two untimed warm-ups
            for app, timing, key in (
                (wrapped, recorded, f"{prefix}stream:{j}"),
                (_streamed, passed, None),
            ):
                client = _Client()
                begun = clock()
                await app(_scope(key), _receive, client)
                if j >= 0:
                    _time(timing, begun, clock(), client.status == 200)
        gated = _Gated()
        following = IdempotencyMiddleware(gated, store=store)
        for j in range(-2, count):
            gated.gate.clear()
            key = f"{prefix}follow:{j}"
            first, second = _Client(), _Client()
            begun = clock()
            running = asyncio.create_task(following(_scope(key), _receive, first))
            await first.first_byte.wait()
            first_at = first.at
            retry_begun = clock()
            retry = asyncio.create_task(following(_scope(key), _receive, second))
            await second.first_byte.wait()
            gated.gate.set()
            await asyncio.gather(running, retry)
            if j >= 0:
                _time(original, begun, first_at, first.status == 200)
                _time(follower, retry_begun, second.at, second.status == 200)
    return [
        Measurement(
            backend="asgi streamed 1 MB",
            scenario="middleware",
            concurrency=1,
            subject=recorded,
            floor=passed,
            floor_name="the same 1 MB stream without the middleware",
            url=_STORE,
            notes={"case": "streamed 1 MB", "bytes": STREAM_BYTES, "chunk": CHUNK},
        ),
        Measurement(
            backend="asgi follower first byte",
            scenario="middleware",
            concurrency=1,
            subject=follower,
            floor=original,
            floor_name="the original's own first byte through the middleware",
            url=_STORE,
            notes={"case": "follower first byte"},
        ),
    ]
