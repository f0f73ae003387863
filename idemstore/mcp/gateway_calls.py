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
import functools
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response, StreamingResponse

from idemstore.callers import fit_scope
from idemstore.mcp import routing_headers, sep3182
from idemstore.mcp.client_gone import Receive, WatchedStream, until_disconnect
from idemstore.mcp.http_relay import error_response, request_headers, response_headers
from idemstore.mcp.live_answers import LiveAnswer, LiveAnswers, Where
from idemstore.mcp.sse_stream import SSEReader, render_event
from idemstore.mcp.tool_call_keys import (
    Answer,
    Forward,
    KeyDeriver,
    ToolCall,
    error_line,
    id_key,
)
from idemstore.mcp.tool_call_runs import CallRunner, PendingCall, ServerGone, ServerResponse
from idemstore.mcp.tool_calls import advertised

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping

    from idemstore.mcp.relay_options import RelayOptions
    from idemstore.protocol import IdempotencyStore

    Execute = Callable[[bytes], Awaitable[ServerResponse | None]]
    Refuse = Callable[[Response], None]
    Verify = Callable[[], Awaitable[Response | None]]
    # An original's live answer, and how to end it (LiveAnswers.end for its place).
    LiveFeed = tuple[LiveAnswer, Callable[[LiveAnswer], None]]
    SendUpstream = Callable[
        [str, str, list[tuple[str, str]], bytes | AsyncIterator[bytes]],
        Awaitable[httpx.Response],
    ]

__all__ = ["ToolCalls", "UpstreamAnswer", "rendered"]

logger = logging.getLogger("idemstore.mcp.gateway")

_MAX_EVENT_BYTES = 64 * 1024 * 1024
# JSON-RPC "Request cancelled" (MCP): the answer to a call its client cancelled. Never recorded.
_CANCELLED = -32800
# error.data.type of a keyed call refused because nothing in the request names its caller.
CALLER_UNKNOWN = "idempotency_caller_unknown"


def _accepts(headers: Mapping[str, str], media: str) -> bool:
    accept = headers.get("accept", "")
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return not accept or media in types or "*/*" in types


def _answer_at_end(
    live: asyncio.Future[Response], headers: Mapping[str, str], task: asyncio.Task[bytes | None]
) -> None:
    """Settle ``live`` from the ended call ``task``, unless an answer was decided while it ran
    (``ToolCalls.answer`` awaits ``live`` alone: one future, no ``asyncio.wait``)."""
    if live.done():
        return
    if task.cancelled():  # the gateway is stopping: so is this request
        live.cancel()
        return
    try:
        data = task.result()
    except Exception:
        logger.exception("tools/call failed in the gateway")
        data = None
    if data is None:
        live.set_result(error_response(500, "the gateway failed while handling tools/call"))
    else:
        live.set_result(rendered(headers, data))


async def _unless_gone(
    live: asyncio.Future[Response], receive: Receive, on_disconnect: Callable[[], None]
) -> Response:
    """``live``'s response, or 499 once the client went away first (``on_disconnect`` told)."""
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        waited: set[asyncio.Future[Any]] = {live, gone}
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if live.done():
        return live.result()
    on_disconnect()
    return Response(status_code=499)


def _streams(upstream: httpx.Response) -> bool:
    media = upstream.headers.get("content-type", "").split(";")[0].strip().lower()
    return 200 <= upstream.status_code < 300 and media == "text/event-stream"


def rendered(headers: Mapping[str, str], data: bytes) -> Response:
    """One JSON-RPC message as the client accepts it: JSON if it may, else a one-event stream."""
    data = data.rstrip(b"\n")
    if _accepts(headers, "application/json") or not _accepts(headers, "text/event-stream"):
        return Response(data, media_type="application/json")
    return Response(
        render_event(data),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


class UpstreamAnswer:
    """The upstream's answer to one forwarded ``tools/call``, relayed to the client as it comes.

    ``until_final()`` reads up to the final response and returns it decoded, with the
    upstream's own bytes of it (``None`` when the answer has none: a non-2xx status, a stream
    cut before it, a body that is not the response). The bytes that carry the final response
    are held back until ``finish()``: the core records the outcome first, so a client that
    retries the moment it has its answer gets the replay, not "in progress". ``finish()`` then
    relays them and reads the rest.
    ``response()`` is the client's copy: the same status, headers and bytes.
    """

    def __init__(
        self, upstream: httpx.Response, request_id: object, live: LiveFeed | None = None
    ) -> None:
        self.upstream = upstream
        self.request_id = request_id
        # Where duplicates attached to this answer get its events (streamed 2xx answers only).
        self._live = live
        # Called when the client closes its copy before the end: a 2026-07-28 client's
        # cancellation (that revision has no notifications/cancelled over HTTP).
        self.on_disconnect: Callable[[], None] | None = None
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._held: list[bytes] = []
        self._rest: AsyncIterator[bytes] | None = None
        self._cut = False
        media = upstream.headers.get("content-type", "").split(";")[0].strip().lower()
        self.streaming = media == "text/event-stream"

    def _matches(self, message: object, data: bytes) -> ServerResponse | None:
        if (
            isinstance(message, dict)
            and "method" not in message
            and message.get("id") == self.request_id
            and ("result" in message or "error" in message)
        ):
            return ServerResponse(message, data)  # the bytes are what the core records
        return None

    async def until_final(self) -> ServerResponse | None:
        """Relay the answer up to its final response; that response, decoded and as sent."""
        try:
            if not 200 <= self.upstream.status_code < 300:
                async for chunk in self.upstream.aiter_raw():
                    self._chunks.put_nowait(chunk)
                return None
            if not self.streaming:
                body = await self.upstream.aread()
                self._held.append(body)
                try:
                    return self._matches(json.loads(body), body)
                except (ValueError, RecursionError):
                    return None
            reader = SSEReader(_MAX_EVENT_BYTES)
            self._rest = self.upstream.aiter_bytes()
            async for chunk in self._rest:
                found = None
                for event in reader.feed(chunk):
                    data = (event.data or "").encode("utf-8", "surrogatepass")
                    if found is None:
                        found = self._matches(event.message(), data)
                        if self._live is not None:
                            self._live[0].event(data, final=found is not None)
                if found is not None:
                    self._held.append(chunk)
                    return found
                self._chunks.put_nowait(chunk)
            return None
        except (httpx.HTTPError, ValueError) as exc:
            # A cut stream: no final response came whole, nothing is recorded; the client's
            # copy is cut too, so it sees what the upstream did.
            logger.warning("upstream answer to a tools/call broke off: %s", exc)
            self._cut = True
            return None

    async def finish(self) -> None:
        """Relay what was held back and the rest of the answer; close the upstream."""
        try:
            for chunk in self._held:
                self._chunks.put_nowait(chunk)
            if self._rest is not None and not self._cut:
                async for chunk in self._rest:
                    self._chunks.put_nowait(chunk)
        except httpx.HTTPError as exc:
            logger.warning("upstream stream broke off after the final response: %s", exc)
            self._cut = True
        finally:
            self._end_live()
            await self.upstream.aclose()
            self._chunks.put_nowait(None)

    async def abandon(self) -> None:
        """Stop relaying (the call was cancelled and the upstream never answered): the
        client's copy ends cut, the upstream connection is closed."""
        self._cut = True
        self._end_live()
        await self.upstream.aclose()
        self._chunks.put_nowait(None)

    def _end_live(self) -> None:
        if self._live is not None:
            answer, end = self._live
            end(answer)
            self._live = None

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

    @property
    def buffered(self) -> bool:
        """Whether the client gets the answer whole (a 2xx JSON body), not as it arrives."""
        return not self.streaming and 200 <= self.upstream.status_code < 300

    def whole_response(self) -> Response:
        """A buffered answer as the upstream sent it, its headers (``Content-Length``) kept."""
        whole = Response(b"".join(self._held), status_code=self.upstream.status_code)
        whole.raw_headers = response_headers(self.upstream)
        return whole

    def response(self) -> Response:
        """The client's copy of the answer (status, headers, bytes as they arrive)."""
        relayed = WatchedStream(self._body(), status_code=self.upstream.status_code)
        relayed.on_disconnect = self.on_disconnect
        relayed.raw_headers = response_headers(
            self.upstream, drop=("content-length", "content-encoding")
        )
        return relayed


class ToolCalls:
    """Deduplicated ``tools/call`` for the gateway: one per gateway, shared by all requests.

    Each POST is its own exchange in Streamable HTTP: JSON-RPC ids are only unique per client,
    and every record lives in the scope of the request's caller (``scope`` given to
    ``handle``), derived keys in the run id's scope *and* the caller's. The key derivation and
    the execution are the relays' shared pieces (``KeyDeriver``, ``CallRunner``); the
    ``readOnlyHint`` annotations read from the ``tools/list`` answers relayed so far are the
    gateway's, shared by every caller.
    """

    def __init__(
        self, store: IdempotencyStore, send_upstream: SendUpstream, options: RelayOptions
    ) -> None:
        self._send = send_upstream
        self._run_id = options.run_id if options.run_id is not None else uuid.uuid4().hex
        self._keys = KeyDeriver(options)
        self._runner = CallRunner(store, options, "mcp_gateway")
        self._running: set[asyncio.Task[Any]] = set()
        # Calls in flight by (scope, Mcp-Session-Id, request id): where a client's
        # notifications/cancelled (a POST of its own) finds the call it names.
        self._in_flight: dict[tuple[str, str, str], PendingCall] = {}
        # Streamed answers of originals running here, for duplicates to attach to.
        self._live = LiveAnswers(_MAX_EVENT_BYTES)

    def _prepare(
        self, message: dict[str, Any], body: bytes, scope: str
    ) -> ToolCall | Answer | Forward:
        run_scope = fit_scope(f"mcp-proxy/run/{self._run_id}/{scope}")
        return self._keys.prepare(message, body, key_scope=scope, run_scope=run_scope)

    def reader(self, message: dict[str, Any]) -> Callable[[dict[str, Any], bytes], bytes]:
        """For an ``initialize``, ``server/discover`` or ``tools/list`` request: how to relay
        each message of its answer (``(message, its bytes) -> bytes to send``).

        The capability is declared in ``initialize`` and ``server/discover`` answers;
        ``tools/list`` annotations are kept for later calls through this gateway.
        """
        method = message.get("method")

        def relay(answer: dict[str, Any], line: bytes) -> bytes:
            if "method" in answer or answer.get("id") != message.get("id"):
                return line
            if method != "tools/list":
                return advertised(answer, line)
            result = answer.get("result")
            if isinstance(result, dict):
                self._keys.read_annotations(result)
            return line

        return relay

    def unidentified(
        self, message: dict[str, Any], body: bytes, headers: Mapping[str, str], *, refuse: bool
    ) -> Response | bytes:
        """A ``tools/call`` from a caller nothing tells apart: it is never deduplicated (no
        record another caller could match). The bytes to relay upstream (the SEP key
        stripped), or the client's answer: an invalid key, or 400 when ``refuse``."""
        verdict = self._prepare(message, body, "mcp-gateway/unidentified")
        if isinstance(verdict, Forward):
            return verdict.line
        if isinstance(verdict, Answer):
            return rendered(headers, verdict.line)
        if not refuse:
            return verdict.forward
        why = (
            "the gateway keeps idempotency records per caller, and this request carries no"
            " credential that names its caller (none of the gateway's caller sources, or a"
            " token it could not verify)"
        )
        error = sep3182.error(sep3182.INVALID_REQUEST, why, CALLER_UNKNOWN, verdict.key or None)
        answer = rendered(headers, error_line(verdict.request_id, error))
        answer.status_code = 400
        return answer

    def cancel(self, scope: str, session: str, request_id: object) -> None:
        """A client's ``notifications/cancelled`` for one of its calls in flight here: the
        proxy's rule: a call not yet forwarded stops; a forwarded derived or ``_meta`` key is
        released at once, a SEP key after ``cancel_grace`` seconds without an answer."""
        pending = self._in_flight.get((scope, session, id_key(request_id)))
        if pending is not None:
            self._cancel(pending)

    def _disconnected(self, pending: PendingCall) -> None:
        """A 2026-07-28 client closed a call's stream: its cancellation. The rule of
        ``cancel``; a derived or ``_meta`` call's upstream stream is closed too, which is how
        a 2026 upstream learns of it (a SEP key's is read on until ``cancel_grace``)."""
        self._cancel(pending)
        if pending.call.kind != "sep" and pending.task is not None:
            pending.task.cancel()

    def _cancel(self, pending: PendingCall) -> None:
        if pending.task is None:
            return
        # A cancelled call takes no more duplicates: a retry runs (or waits) by its key.
        self._live.withdraw((pending.call.scope, pending.call.key))
        if pending.forwarded:
            self._runner.cancel_forwarded(pending)
        else:
            pending.task.cancel()

    async def handle(
        self,
        message: dict[str, Any],
        body: bytes,
        *,
        path: str,
        headers: Mapping[str, str],
        scope: str,
        session: str = "",
        verify: Verify | None = None,
        receive: Receive | None = None,
    ) -> Response | bytes:
        """The client's answer to a ``tools/call``, or the bytes to relay upstream unread.

        ``verify``, when given, runs before a recorded outcome is served: ``None`` lets the
        replay go, a ``Response`` is the client's answer instead (the upstream's refusal).
        ``receive``: the request's ASGI channel, to see a 2026-07-28 client go away (its
        cancellation) while the answer is awaited.
        """
        verdict = self._prepare(message, body, scope)
        if isinstance(verdict, Forward):
            return verdict.line
        if isinstance(verdict, Answer):
            return rendered(headers, verdict.line)
        where = (verdict.scope, verdict.key)
        attached = self._live.attach(where, verdict.fingerprint)
        if attached is not None and _accepts(headers, "text/event-stream"):
            # The original streams here: follow it live rather than be refused or wait.
            refusal = await verify() if verify is not None else None
            if refusal is not None:
                return refusal
            follow = StreamingResponse(
                attached.events(verdict.request_id), media_type="text/event-stream"
            )
            follow.headers["cache-control"] = "no-cache"
            return follow
        pending = PendingCall(verdict)
        in_flight = (scope, session, verdict.id_key)

        async def run(execute: Execute, refuse: Refuse) -> bytes | None:
            async def exchange(forward: bytes) -> ServerResponse:
                final = await execute(forward)
                if final is None:
                    raise ServerGone("the upstream gave no final response")
                return final  # the upstream's own bytes: the record replays them exactly

            async def admit_replay() -> bool:
                assert verify is not None
                refusal = await verify()
                if refusal is not None:
                    refuse(refusal)
                return refusal is None

            admit = admit_replay if verify is not None else None
            pending.task = asyncio.ensure_future(self._runner.answer(pending, exchange, admit))
            self._in_flight.setdefault(in_flight, pending)
            try:
                return await pending.task
            finally:
                if self._in_flight.get(in_flight) is pending:
                    del self._in_flight[in_flight]

        modern = headers.get(routing_headers.VERSION_HEADER) in routing_headers.MODERN_VERSIONS
        return await self.answer(
            path=path,
            headers=headers,
            request_id=verdict.request_id,
            run=run,
            attachable=(where, verdict.fingerprint),
            on_disconnect=functools.partial(self._disconnected, pending) if modern else None,
            receive=receive,
        )

    async def answer(
        self,
        *,
        path: str,
        headers: Mapping[str, str],
        request_id: object,
        run: Callable[[Execute, Refuse], Coroutine[Any, Any, bytes | None]],
        attachable: tuple[Where, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        receive: Receive | None = None,
    ) -> Response:
        """Run one call through the core, detached from the client's connection.

        ``run(execute, refuse)`` is the core's execution path: it reserves the key and either
        calls ``execute(body)`` once (forward upstream; the final response, ``None`` when none
        came) or decides without the upstream (a replay, an error). It returns the JSON-RPC
        answer for the client, or calls ``refuse(response)`` to answer with an HTTP response
        of its own. When the upstream was reached, the client gets the upstream's own answer
        as it streams instead. ``attachable``: the call's (scope, key) and fingerprint, under which
        duplicates may attach to its answer while it streams (``LiveAnswers``).
        ``on_disconnect``: called when the client closes a streamed answer before its end.
        """
        loop = asyncio.get_running_loop()
        live: asyncio.Future[Response] = loop.create_future()
        forwarded_answers: list[UpstreamAnswer] = []

        def refuse(response: Response) -> None:
            if not live.done():
                live.set_result(response)

        async def execute(body: bytes) -> ServerResponse | None:
            forwarded = request_headers(headers.items(), rewritten=True)
            try:
                upstream = await self._send("POST", path, forwarded, body)
            except httpx.HTTPError as exc:
                logger.warning("tools/call not forwarded: %s: %s", type(exc).__name__, exc)
                message = f"the MCP upstream could not be reached ({type(exc).__name__})"
                refuse(error_response(502, message))
                return None
            feed = self._feed(attachable, upstream)
            answer = UpstreamAnswer(upstream, request_id, feed)
            answer.on_disconnect = on_disconnect
            forwarded_answers.append(answer)
            if not answer.buffered:
                refuse(answer.response())
            return await answer.until_final()

        async def drive() -> bytes | None:
            try:
                return await run(execute, refuse)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the gateway itself is stopping
                # The client cancelled the call: before it was forwarded, or the upstream
                # never answered within cancel_grace. Its key is released; end the relay.
                for answer in forwarded_answers:
                    await answer.abandon()
                forwarded_answers.clear()
                return error_line(request_id, sep3182.error(_CANCELLED, "Request cancelled"))
            finally:
                # The outcome is recorded (or the key released): now the client may see it.
                for answer in forwarded_answers:
                    await answer.finish()
                    if answer.buffered:
                        refuse(answer.whole_response())

        task = loop.create_task(drive(), name="mcp-gateway:tools/call")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(functools.partial(_answer_at_end, live, headers))
        # The answer is whichever comes first: a response decided while the call runs, or the
        # call's end. A client that goes away cancels only this wait: the task runs on (but
        # a 2026-07-28 client going away is its cancellation: on_disconnect).
        if on_disconnect is not None and receive is not None:
            return await _unless_gone(live, receive, on_disconnect)
        return await live

    def _feed(
        self, attachable: tuple[Where, str] | None, upstream: httpx.Response
    ) -> LiveFeed | None:
        """Where a streamed 2xx answer's events go, for duplicates to attach to them."""
        if attachable is None or not _streams(upstream):
            return None
        where, fingerprint = attachable
        return self._live.start(where, fingerprint), functools.partial(self._live.end, where)

    async def drain(self) -> None:
        """Wait for every call already forwarded to be read to its end (and recorded)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
