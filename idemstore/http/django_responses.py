"""A Django response as the ASGI middleware's messages, and those messages as a Django response
again: how the Django door streams a keyed response through the ASGI middleware, which records
it on the way, while its client receives it.

A view's ``StreamingHttpResponse`` is read chunk by chunk (a sync one in Django's thread, an
async one on the server's loop) and each chunk is sent on as it comes; the door answers Django
with a ``StreamingHttpResponse`` as soon as the response's first chunk is out, and with a plain
``HttpResponse`` when the whole response came in one message (a plain view, a replay, a
refusal).
"""

from __future__ import annotations

import asyncio
import contextlib
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any, NamedTuple

from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse

from idemstore.loop_thread import in_calling_thread

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator

__all__ = [
    "Opened",
    "VIEW",
    "aresponse_of",
    "opened_async",
    "opened_sync",
    "response_of",
    "view_app",
]

VIEW = "idemstore.http.django.view"
"""Where the ASGI scope carries the door's view: a coroutine function giving ``Opened``."""

Headers = list[tuple[bytes, bytes]]
Message = dict[str, Any]


async def _nothing() -> None:
    return None


class Opened(NamedTuple):
    """A view's response, opened: its head, its body so far, and how to read the rest
    (``more`` gives the next chunk, ``None`` at the end; ``None`` itself: the body is whole)."""

    status: int
    headers: Headers
    body: bytes
    more: Callable[[], Awaitable[bytes | None]] | None = None
    close: Callable[[], Awaitable[None]] = _nothing


def _head(response: HttpResponseBase) -> tuple[int, Headers]:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    for morsel in response.cookies.values():
        headers.append((b"set-cookie", morsel.OutputString().encode("latin-1")))
    return response.status_code, headers


def opened_sync(response: HttpResponseBase) -> Opened:
    """In Django's thread: a streaming response is read from there, chunk by chunk."""
    status, headers = _head(response)
    if not isinstance(response, StreamingHttpResponse):
        body = response.content
        response.close()
        return Opened(status, headers, body)
    chunks: Iterator[bytes] = iter(response.streaming_content)

    async def more() -> bytes | None:
        chunk = await in_calling_thread(lambda: next(chunks, None))
        return None if chunk is None else bytes(chunk)

    async def close() -> None:
        await in_calling_thread(response.close)

    return Opened(status, headers, b"", more, close)


async def opened_async(response: HttpResponseBase, here: asyncio.AbstractEventLoop) -> Opened:
    """On the server's loop ``here``: an async streaming response is read there."""
    if not (isinstance(response, StreamingHttpResponse) and response.is_async):
        if isinstance(response, StreamingHttpResponse):
            # A sync iterator served from async code: read whole, as Django itself would.
            status, headers = _head(response)
            body = b"".join(response.streaming_content)
            response.close()
            return Opened(status, headers, body)
        return opened_sync(response)
    status, headers = _head(response)
    chunks: AsyncIterator[bytes] = aiter(response.streaming_content)

    async def read() -> bytes | None:
        chunk = await anext(chunks, None)
        return None if chunk is None else bytes(chunk)

    async def more() -> bytes | None:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(read(), here))

    return Opened(status, headers, b"", more)


async def view_app(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI middleware's inner app: the Django view, run where Django runs it, its
    response sent on as it is read."""
    opened: Opened = await scope[VIEW]()
    await send({"type": "http.response.start", "status": opened.status, "headers": opened.headers})
    if opened.more is None:
        await send({"type": "http.response.body", "body": opened.body})
        return
    try:
        while (chunk := await opened.more()) is not None:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        await opened.close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _with_headers(response: HttpResponseBase, headers: Headers) -> HttpResponseBase:
    for name, value in headers:
        text = value.decode("latin-1")
        if name == b"set-cookie":
            response.cookies.load(SimpleCookie(text))
        else:
            response[name.decode("latin-1")] = text
    return response


def response_of(messages: Generator[object, None, object]) -> HttpResponseBase:
    """The Django response for the ASGI messages ``messages`` yields (``LoopThread.stream``):
    streamed from its first chunk when it comes in several, else whole."""
    status, headers, chunks = 500, [], []
    for message in messages:
        assert isinstance(message, dict)
        if message["type"] == "http.response.start":
            status, headers = int(message["status"]), list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if message.get("more_body", False):
                rest = _rest(chunks, messages)
                return _with_headers(StreamingHttpResponse(rest, status=status), headers)
    return _with_headers(HttpResponse(b"".join(chunks), status=status), headers)


def _rest(first: list[bytes], messages: Generator[object, None, object]) -> Iterator[bytes]:
    try:
        yield from first
        for message in messages:
            assert isinstance(message, dict)
            if message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])
    finally:
        messages.close()  # the client left: the request's coroutine is cancelled


async def aresponse_of(
    messages: asyncio.Queue[Message], answered: asyncio.Future[None]
) -> HttpResponseBase:
    """``response_of`` for the async path: the messages arrive in ``messages`` until the
    request's coroutine (``answered``) ends."""

    async def next_message() -> Message | None:
        getter = asyncio.ensure_future(messages.get())
        either: set[asyncio.Future[Any]] = {getter, answered}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        if not messages.empty():
            return messages.get_nowait()
        answered.result()  # its error, if it failed
        return None

    status, headers, chunks = 500, [], []
    while (message := await next_message()) is not None:
        if message["type"] == "http.response.start":
            status, headers = int(message["status"]), list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if message.get("more_body", False):
                rest = _arest(chunks, next_message, answered)
                return _with_headers(StreamingHttpResponse(rest, status=status), headers)
    return _with_headers(HttpResponse(b"".join(chunks), status=status), headers)


async def _arest(
    first: list[bytes],
    next_message: Callable[[], Awaitable[Message | None]],
    answered: asyncio.Future[None],
) -> AsyncIterator[bytes]:
    try:
        for chunk in first:
            yield chunk
        while (message := await next_message()) is not None:
            if message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])
    finally:
        if not answered.done():
            answered.cancel()  # the client left: the request's coroutine is cancelled
            with contextlib.suppress(BaseException):
                await answered
