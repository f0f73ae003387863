"""How the HTTP doors record a response and send it: a response captured whole
(``Captured``, the record format every HTTP door shares, so an ASGI and a WSGI deployment of
one API may share a store) and the ``send`` that passes it on as it is produced and records it
before the client sees its end (``Recorder``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemstore.http.live import LiveResponse

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


OnEnd = Callable[["LiveResponse"], Awaitable[None]]


class Recorder:
    """An ASGI ``send`` that passes the response on as the app sends it, keeping a copy in a
    ``LiveResponse`` (up to its limit) to record it.

    The client gets every byte as the app produces it (an event stream, a chunked body alike):
    nothing is buffered until the end. When the app sends the message that ends the response,
    ``on_end`` is awaited first, with the live response (its size, whether it went past the
    limit, and what of it cannot be recorded: trailers, an extension's message), and only then
    does the end go out to the client, so a retry sent on seeing it finds the outcome.
    """

    __slots__ = ("_on_end", "_send", "ended", "live")

    def __init__(self, send: Send, live: LiveResponse, on_end: OnEnd) -> None:
        self._send = send
        self._on_end = on_end
        self.live = live
        self.ended = False

    async def __call__(self, message: Message) -> None:
        if self.ended:
            # After the end (trailers, say): nothing of the body is left; pass it on.
            await self._send(message)
            return
        kind = message["type"]
        live = self.live
        if kind == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            if message.get("trailers"):
                live.unrecordable = "a response with trailers"
            live.start(int(message["status"]), headers)
        elif kind == "http.response.body":
            live.add(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.ended = True
                await self._on_end(live)
                live.end()
        else:
            # Anything else (an extension) cannot be recorded faithfully.
            live.unrecordable = f"using {kind!r}"
        await self._send(message)
