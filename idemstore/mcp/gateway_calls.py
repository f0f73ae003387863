"""``tools/call`` over Streamable HTTP: the transport half of the gateway's deduplication.

The decisions (which key, which scope, replay or run or reject, what gets recorded) belong to
the core the stdio proxy runs too; this module only does what HTTP adds:

- running a call upstream **detached from the client's connection**: once forwarded, the
  upstream's answer is read to its end whatever the client does, so its outcome is recorded
  (a client that disconnects mid-call leaves a retry to replay it, or to wait for it);
- finding the final response in a JSON body or in an event stream, while the client gets every
  event as it arrives;
- rendering a replay or an error as JSON or as a one-event stream, whichever the retry's
  ``Accept`` allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response, StreamingResponse

from idemstore.mcp.http_relay import error_response, request_headers, response_headers
from idemstore.mcp.sse_stream import SSEReader, render_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping

    from idemstore.protocol import IdempotencyStore

    Execute = Callable[[bytes], Awaitable[dict[str, Any] | None]]
    SendUpstream = Callable[
        [str, str, list[tuple[str, str]], bytes | AsyncIterator[bytes]],
        Awaitable[httpx.Response],
    ]

__all__ = ["ToolCalls", "UpstreamAnswer", "capability_added", "rendered"]

logger = logging.getLogger("idemstore.mcp.gateway")

_MAX_EVENT_BYTES = 64 * 1024 * 1024


def capability_added(message: dict[str, Any]) -> dict[str, Any] | None:
    """``message`` (an initialize/discover answer) declaring ``tools.idempotency``, or ``None``.

    Seam: filled by the shared MCP core.
    """
    return None


def _accepts(headers: Mapping[str, str], media: str) -> bool:
    accept = headers.get("accept", "")
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return not accept or media in types or "*/*" in types


def rendered(headers: Mapping[str, str], data: bytes) -> Response:
    """One JSON-RPC message as the client accepts it: JSON if it may, else a one-event stream."""
    if _accepts(headers, "application/json") or not _accepts(headers, "text/event-stream"):
        return Response(data, media_type="application/json")
    return Response(
        render_event(data),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


class UpstreamAnswer:
    """The upstream's answer to one forwarded ``tools/call``, read to its end by ``pump``.

    ``pump`` returns the decoded final response, or ``None`` when the answer had none (a
    non-2xx status, a stream cut before it, a body that is not the response). ``response()``
    is what the client gets meanwhile: the same status, headers and bytes, as they arrive.
    """

    def __init__(self, upstream: httpx.Response, request_id: object) -> None:
        self.upstream = upstream
        self.request_id = request_id
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._cut = False
        media = upstream.headers.get("content-type", "").split(";")[0].strip().lower()
        self.streaming = media == "text/event-stream"

    def _matches(self, message: object) -> dict[str, Any] | None:
        if (
            isinstance(message, dict)
            and "method" not in message
            and message.get("id") == self.request_id
            and ("result" in message or "error" in message)
        ):
            return message
        return None

    async def pump(self) -> dict[str, Any] | None:
        """Read the upstream answer to its end, feeding the client's copy; the final response."""
        found: dict[str, Any] | None = None
        try:
            if not 200 <= self.upstream.status_code < 300:
                async for chunk in self.upstream.aiter_raw():
                    self._chunks.put_nowait(chunk)
            elif self.streaming:
                reader = SSEReader(_MAX_EVENT_BYTES)
                async for chunk in self.upstream.aiter_bytes():
                    for event in reader.feed(chunk):
                        if found is None:
                            found = self._matches(event.message())
                    self._chunks.put_nowait(chunk)
            else:
                body = await self.upstream.aread()
                with contextlib.suppress(ValueError, RecursionError):
                    found = self._matches(json.loads(body))
                self._chunks.put_nowait(body)
        except (httpx.HTTPError, ValueError) as exc:
            # A cut stream: a final response that came whole still stands (the tool ran and
            # said so); the client's copy is cut too, so it sees what the upstream did.
            logger.warning("upstream answer to a tools/call broke off: %s", exc)
            self._cut = True
        finally:
            await self.upstream.aclose()
            self._chunks.put_nowait(None)
        return found

    async def _body(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._chunks.get()
            if chunk is None:
                break
            yield chunk
        if self._cut:
            # End the client's response abruptly, as the upstream's ended: a clean end would
            # tell the client an incomplete stream was whole.
            raise ConnectionError("the upstream answer was cut")

    def response(self) -> Response:
        """The client's copy of the answer (status, headers, bytes as they arrive)."""
        relayed = StreamingResponse(self._body(), status_code=self.upstream.status_code)
        relayed.raw_headers = response_headers(
            self.upstream, drop=("content-length", "content-encoding")
        )
        return relayed


class ToolCalls:
    """Deduplicated ``tools/call`` for the gateway: one per gateway, shared by all requests."""

    def __init__(
        self,
        store: IdempotencyStore,
        send_upstream: SendUpstream,
        *,
        upstream: str,
        **options: Any,
    ) -> None:
        self._store = store
        self._send = send_upstream
        self._upstream = upstream
        self._options = options
        self._running: set[asyncio.Task[Any]] = set()

    async def handle(
        self, message: dict[str, Any], body: bytes, *, headers: Mapping[str, str], scope: str
    ) -> Response | None:
        """The client's answer to a ``tools/call``; ``None`` leaves it to be relayed untouched.

        Seam: the key, scope and policy decisions come from the shared MCP core.
        """
        return None

    async def answer(
        self,
        *,
        path: str,
        headers: Mapping[str, str],
        request_id: object,
        run: Callable[[Execute], Coroutine[Any, Any, bytes]],
    ) -> Response:
        """Run one call through the core, detached from the client's connection.

        ``run(execute)`` is the core's execution path: it reserves the key and either calls
        ``execute(body)`` once (forward upstream; the final response, ``None`` when none came)
        or decides without the upstream (a replay, an error). It returns the JSON-RPC answer
        for the client. When the upstream was reached, the client gets the upstream's own
        answer as it streams instead.
        """
        loop = asyncio.get_running_loop()
        live: asyncio.Future[Response] = loop.create_future()

        async def execute(body: bytes) -> dict[str, Any] | None:
            forwarded = request_headers(headers.items(), rewritten=True)
            try:
                upstream = await self._send("POST", path, forwarded, body)
            except httpx.HTTPError as exc:
                logger.warning("tools/call not forwarded: %s: %s", type(exc).__name__, exc)
                if not live.done():
                    message = f"the MCP upstream could not be reached ({type(exc).__name__})"
                    live.set_result(error_response(502, message))
                return None
            answer = UpstreamAnswer(upstream, request_id)
            if not live.done():
                live.set_result(answer.response())
            return await answer.pump()

        task = loop.create_task(run(execute), name="mcp-gateway:tools/call")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        # Waiting does not cancel the task: a client that goes away leaves it to finish.
        pending: set[asyncio.Future[Any]] = {live, task}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if live.done():
            return live.result()
        try:
            data = task.result()
        except Exception:
            logger.exception("tools/call failed in the gateway")
            return error_response(500, "the gateway failed while handling tools/call")
        return rendered(headers, data)

    async def drain(self) -> None:
        """Wait for every call already forwarded to be read to its end (and recorded)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
