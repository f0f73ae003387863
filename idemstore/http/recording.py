"""How the HTTP doors record a response and send it: a response captured whole
(``Captured``, the record format every HTTP door shares, so an ASGI and a WSGI deployment of
one API may share a store) and the ``send`` that captures it before the client sees its end
(``Recorder``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Captured", "Recorder", "send_response"]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Captured:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def encode(self) -> bytes:
        head = json.dumps(
            {
                "v": _FORMAT_VERSION,
                "status": self.status,
                "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in self.headers],
            },
            separators=(",", ":"),
        ).encode("ascii")
        # json.dumps never writes a raw newline, so the first one ends the head.
        return head + b"\n" + self.body

    @classmethod
    def decode(cls, data: bytes) -> Captured:
        head, _, body = data.partition(b"\n")
        loaded = json.loads(head)
        if loaded.get("v") != _FORMAT_VERSION:
            raise ValueError(f"unknown record format {loaded.get('v')!r}")
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in loaded["headers"]]
        return cls(int(loaded["status"]), headers, body)


async def send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


OnEnd = Callable[["Captured | None", str], Awaitable[None]]


class Recorder:
    """An ASGI ``send`` that buffers the response, up to a size, instead of sending it.

    Past the limit, or for an event stream, it sends what it holds and passes the rest
    through (streamed). Either way, when the app sends the message that ends the response,
    ``on_end`` is awaited first, with the captured response (``None`` when streamed, with why
    not), and only then does the end go out to the client.
    """

    __slots__ = (
        "_chunks",
        "_headers",
        "_limit",
        "_on_end",
        "_send",
        "_size",
        "_status",
        "ended",
        "streamed",
        "why_not",
    )

    def __init__(self, send: Send, limit: int, on_end: OnEnd) -> None:
        self._send = send
        self._limit = limit
        self._on_end = on_end
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self.streamed = False
        self.ended = False
        self.why_not = ""

    async def __call__(self, message: Message) -> None:
        if self.ended:
            # After the end: nothing of the response is left to send (ASGI servers ignore
            # such messages too); pass it on so the server decides.
            await self._send(message)
            return
        if self.streamed:
            await self._pass(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self._status = int(message["status"])
            self._headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            why = ""
            if message.get("trailers"):
                why = "a response with trailers"
            elif any(
                name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream")
                for name, value in self._headers
            ):
                why = "an event stream"
            if why:
                # Nothing is held yet: pass the start through and everything after it.
                self.streamed = True
                self.why_not = why
                await self._pass(message)
            return
        if kind == "http.response.body":
            chunk = bytes(message.get("body", b""))
            self._size += len(chunk)
            if self._size > self._limit:
                await self._stream(f"larger than {self._limit} bytes")
                await self._pass(message)
                return
            self._chunks.append(chunk)
            if not message.get("more_body", False):
                self.ended = True
                captured = Captured(self._status, self._headers, b"".join(self._chunks))
                self._chunks.clear()
                await self._on_end(captured, "")
                await send_response(self._send, captured.status, captured.headers, captured.body)
            return
        # Anything else (trailers, an extension) cannot be recorded faithfully.
        await self._stream(f"using {kind!r}")
        await self._pass(message)

    async def _pass(self, message: Message) -> None:
        """Send ``message`` on; the one that ends the response only after ``on_end``."""
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
            await self._on_end(None, self.why_not)
        await self._send(message)

    async def flush(self) -> None:
        """Send what is held (the app ended without finishing its response)."""
        if not self.streamed:
            await self._stream("incomplete")

    async def _stream(self, why: str) -> None:
        """Stop buffering: send what is held so far and pass everything after it through."""
        self.streamed = True
        self.why_not = why
        if self._status:
            await self._send(
                {"type": "http.response.start", "status": self._status, "headers": self._headers}
            )
        for chunk in self._chunks:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._chunks.clear()
