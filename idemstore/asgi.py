"""HTTP ``Idempotency-Key`` (draft-ietf-httpapi-idempotency-key-header) for any ASGI app.

``IdempotencyMiddleware(app, store=..., **options)`` is pure ASGI: it works under Starlette's
``app.add_middleware(IdempotencyMiddleware, store=store)``, FastAPI, or wrapped around any ASGI
callable. A keyed request runs once per ``(scope, key)``; a retry with the same request gets
the recorded response plus ``Idempotent-Replayed: true``; other outcomes, as the draft says:

- key missing where required: 400; key reused with a different request: 422;
- a request with the same key still in progress: 409 (with ``Retry-After``);

each as ``application/problem+json`` with a ``detail`` that says what to do. Every refusal of
the execution path is answered from one table (``idemstore.http_problems``, docs/refusals.md).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.asgi_options import (
    HEADER_NAME,
    check_app,
    check_size,
    header_names,
    method_set,
    required_predicate,
    store_of,
)
from idemstore.callers import fit_scope
from idemstore.errors import ConfigurationError, IdemstoreError, InvalidKeyError
from idemstore.execution import Execution, ExecutionPolicy, Replay
from idemstore.fingerprint_fields import field_selection
from idemstore.http_identity import (
    default_scope,
    header_values,
    parse_idempotency_key,
    request_fingerprint,
)
from idemstore.http_problems import Problem, problem, refusal_problem
from idemstore.records import MAX_KEY_LENGTH, check_identity
from idemstore.refusals import Refusal, refusal_of

if TYPE_CHECKING:
    from idemstore.execution import TakeoverPolicy
    from idemstore.protocol import IdempotencyStore

__all__ = ["IdempotencyMiddleware", "default_scope", "parse_idempotency_key"]

logger = logging.getLogger("idemstore.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ScopeFunction = Callable[[Scope], "str | Awaitable[str | None] | None"]
RoutePredicate = Callable[[Scope], bool]

HEADER = HEADER_NAME.encode("ascii")
REPLAYED_HEADER = (b"idempotent-replayed", b"true")

# Response extensions that would bypass ``send``'s body messages and so the recorder.
_BYPASS_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")

_FORMAT_VERSION = 1


class _ClientGone(Exception):
    """Internal: the client disconnected while the request body was being read."""


@dataclass(frozen=True, slots=True)
class _Captured:
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
    def decode(cls, data: bytes) -> _Captured:
        head, _, body = data.partition(b"\n")
        loaded = json.loads(head)
        if loaded.get("v") != _FORMAT_VERSION:
            raise ValueError(f"unknown record format {loaded.get('v')!r}")
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in loaded["headers"]]
        return cls(int(loaded["status"]), headers, body)


async def _send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on unsafe requests of an ASGI app.

    Args:
        app: the ASGI app to wrap.
        store: any ``IdempotencyStore`` (the caller owns it: opens and closes it), or a store
            URL such as ``"sqlite:///idempotency.db"``: then the middleware owns the store,
            which connects on first use and is closed on the ASGI lifespan's shutdown (or by
            ``close()``). Several server processes need a store they all share.
        methods: methods the key applies to (default POST and PATCH); others pass through.
        required: ``True`` to require a key on every request of those methods, a sequence of
            path patterns (``fnmatch``, e.g. ``"/orders/*"``), or a predicate given the ASGI
            scope. A missing key where required is a 400.
        scope: callable given the ASGI scope returning the caller's authorization boundary
            (a string; may be async). Records are only matched within one scope. Default:
            ``default_scope`` (authenticated user, else a hash of the request's credentials
            as ``idemstore.callers`` reads them); a keyed request from a caller it cannot
            tell apart is refused with 400 rather than matched against other anonymous
            callers' records. Return a constant
            to share keys between all callers on purpose.
        retention: seconds a response is replayed (default 24 hours).
        lease_ttl: seconds a request holds its key without a heartbeat; heartbeats extend it
            while the app runs.
        max_body_bytes: largest request body a keyed request may have (413 beyond it).
        max_response_bytes: largest response recorded; a bigger one is streamed to the client,
            not recorded, and its key released (a warning is logged).
        record_server_errors: record 5xx responses too. Off by default: a 5xx says the server
            failed, so the key is released and a retry runs the request again.
        max_key_length: longest key accepted (400 beyond it).
        on_takeover: a request whose key was held by a request that died (its lease lapsed)
            without a response: ``"run"`` it again (default), or ``"refuse"`` with 409
            "Outcome unknown", for this and every retry under that key (the earlier request
            may have taken effect: see docs/refusals.md).
        fingerprint_exclude: JSON pointers (RFC 6901, such as ``"/meta/sent_at"``) into a
            JSON request body whose values the fingerprint leaves out, so a retry that
            differs only there replays instead of a 422. A body that is not JSON counts
            whole. The risk: a left-out field that changes what the request does makes two
            different requests share one outcome.
        fingerprint_include: JSON pointers the fingerprint covers instead of the whole JSON
            body (not with ``fingerprint_exclude``).
        fingerprint_headers: header names whose values the fingerprint covers too (by
            default it covers none).

    Every option is checked here: a wrong one raises ``ConfigurationError`` or ``TypeError``.
    """

    __slots__ = (
        "_fields",
        "_headers",
        "_max_key_length",
        "_methods",
        "_owns_store",
        "_policy",
        "_required",
        "_scope",
        "app",
        "max_body_bytes",
        "max_response_bytes",
        "record_server_errors",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore | str,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool | Iterable[str] | RoutePredicate = False,
        scope: ScopeFunction | None = None,
        retention: float = 86400.0,
        lease_ttl: float = 30.0,
        max_body_bytes: int = 1024 * 1024,
        max_response_bytes: int = 1024 * 1024,
        record_server_errors: bool = False,
        max_key_length: int = MAX_KEY_LENGTH,
        on_takeover: TakeoverPolicy = "run",
        fingerprint_exclude: Iterable[str] | None = None,
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_headers: Iterable[str] | None = None,
    ) -> None:
        check_app(app)
        self.app = app
        self._methods = method_set(methods)
        self._required = required_predicate(required)
        if scope is not None and not callable(scope):
            raise ConfigurationError(f"scope must be a callable given the ASGI scope: {scope!r}")
        self._scope: ScopeFunction = scope if scope is not None else default_scope
        self.max_body_bytes = check_size("max_body_bytes", max_body_bytes)
        self.max_response_bytes = check_size("max_response_bytes", max_response_bytes)
        if not isinstance(record_server_errors, bool):
            raise TypeError(f"record_server_errors must be True or False: {record_server_errors!r}")
        self.record_server_errors = record_server_errors
        self._max_key_length = check_size("max_key_length", max_key_length, least=1)
        self._fields = field_selection(fingerprint_include, fingerprint_exclude)
        self._headers = header_names(fingerprint_headers)
        # The store last: every other mistake is reported before a URL's store is built.
        opened, self._owns_store = store_of(store)
        self._policy = ExecutionPolicy(
            opened,
            lease_ttl=lease_ttl,
            retention=retention,
            in_flight="reject",
            on_takeover=on_takeover,
            consumer="asgi",
        )

    @property
    def store(self) -> IdempotencyStore:
        """The store the records are kept in."""
        return self._policy.store

    async def close(self) -> None:
        """Close the store if the middleware opened it from a URL (else it is the caller's)."""
        if self._owns_store:
            await self._policy.store.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and self._owns_store:
            await self.app(scope, receive, self._closing_at_shutdown(send))
            return
        if scope["type"] != "http" or scope.get("method", "").upper() not in self._methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, HEADER)
        if not values:
            if self._required(scope):
                await _send_response(
                    send,
                    *problem(
                        400,
                        "Idempotency-Key required",
                        "This operation requires an Idempotency-Key header: send a unique value"
                        ' per operation, e.g. Idempotency-Key: "<a new UUID>", and the same'
                        " value when you retry it.",
                    ),
                )
                return
            await self.app(scope, receive, send)
            return
        await self._keyed(scope, receive, send, values)

    def _closing_at_shutdown(self, send: Send) -> Send:
        """``send`` for the lifespan: the owned store is closed once the app has shut down."""

        async def closing(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                try:
                    await self.close()
                except Exception:
                    logger.warning("could not close the idempotency store", exc_info=True)
            await send(message)

        return closing

    async def _keyed(self, scope: Scope, receive: Receive, send: Send, values: list[bytes]) -> None:
        if len(values) > 1:
            why = "The request carries more than one Idempotency-Key field; send exactly one."
            await _send_response(send, *refusal_problem(Refusal.INVALID_KEY, key=None, detail=why))
            return
        try:
            key = parse_idempotency_key(values[0].decode("latin-1"))
            check_identity(key, "", max_key_length=self._max_key_length)
        except (ValueError, InvalidKeyError) as exc:
            why = f"Idempotency-Key: {exc}."
            await _send_response(send, *refusal_problem(Refusal.INVALID_KEY, key=None, detail=why))
            return
        caller = self._scope(scope)
        if inspect.isawaitable(caller):
            caller = await caller
        if caller is None:
            await _send_response(
                send,
                *problem(
                    400,
                    "Idempotency-Key needs a caller",
                    "Idempotency keys are kept per caller, and this request carries no"
                    " credentials to tell its caller apart; authenticate the request.",
                    key=key,
                ),
            )
            return
        if not isinstance(caller, str):
            raise TypeError(f"the scope callable returned {type(caller).__name__}, not str")
        caller = fit_scope(caller)

        try:
            body, more = await self._read_body(receive)
        except _ClientGone:
            return
        if more:
            await _send_response(
                send,
                *problem(
                    413,
                    "Request body too large for an idempotent request",
                    f"Requests with an Idempotency-Key may carry at most {self.max_body_bytes}"
                    " bytes of body.",
                    key=key,
                ),
            )
            return
        print_ = request_fingerprint(scope, body, fields=self._fields, headers=self._headers)
        await self._run(scope, receive, send, key, caller, print_, body)

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        """The request body, and whether it went past ``max_body_bytes`` (then stop reading)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left before sending its whole request: nothing runs.
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: str,
        caller: str,
        print_: str,
        body: bytes,
    ) -> None:
        try:
            claim = await self._policy.begin(key, print_, scope=caller)
        except Exception as exc:
            refusal = refusal_of(exc)
            if refusal is None:
                raise  # not a refusal: the server answers 500, as for any bug
            await _send_response(send, *self._refusal(refusal, key, exc))
            return
        if isinstance(claim, Replay):
            await self._replay(send, key, claim.response)
            return
        await self._execute(claim, scope, receive, send, body)

    @staticmethod
    def _refusal(refusal: Refusal, key: str, exc: Exception) -> Problem:
        """The answer to ``refusal`` (from ``exc``), logged where the server is at fault."""
        if refusal in (Refusal.STORE_UNAVAILABLE, Refusal.LEASE_LOST, Refusal.SCHEMA_MISSING):
            logger.error("idempotency store failed before the request ran: %s", exc)
        # What is wrong with a key or scope is safe to tell (no secret is in it).
        detail = f"Idempotency-Key: {exc}." if refusal is Refusal.INVALID_KEY else None
        return refusal_problem(refusal, key=key, detail=detail)

    async def _replay(self, send: Send, key: str, stored: bytes) -> None:
        try:
            recorded = _Captured.decode(stored)
        except (ValueError, KeyError, TypeError) as exc:
            logger.error("record for Idempotency-Key %r is unreadable: %s", key, exc)
            await _send_response(
                send,
                *problem(
                    500, "Unreadable record", "The recorded response cannot be read.", key=key
                ),
            )
            return
        await _send_response(
            send, recorded.status, [*recorded.headers, REPLAYED_HEADER], recorded.body
        )

    async def _execute(
        self, execution: Execution, scope: Scope, receive: Receive, send: Send, body: bytes
    ) -> None:
        replayed_body = False

        async def replay_receive() -> Message:
            nonlocal replayed_body
            if not replayed_body:
                replayed_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        inner_scope = dict(scope)
        extensions = scope.get("extensions")
        if extensions:
            inner_scope["extensions"] = {
                k: v for k, v in extensions.items() if k not in _BYPASS_EXTENSIONS
            }

        async def settle(captured: _Captured | None, why_not: str) -> None:
            # The response is complete (its last body message is in hand) and not yet sent:
            # record it, or give the key up, *before* the client can see the end of it, so a
            # retry sent on seeing it finds the outcome. What the app does after this (a
            # background task) is not the request's outcome.
            if captured is None:
                logger.warning(
                    "response to %s %s under Idempotency-Key %r was %s: sent but not"
                    " recorded, key released",
                    scope.get("method"),
                    scope.get("path"),
                    execution.key,
                    why_not,
                )
                await execution.release()
            elif captured.status >= 500 and not self.record_server_errors:
                await execution.release()
            else:
                try:
                    await execution.settle(captured.encode())
                except IdemstoreError as exc:
                    logger.warning(
                        "response under Idempotency-Key %r could not be recorded: %s",
                        execution.key,
                        exc,
                    )

        recorder = _Recorder(send, self.max_response_bytes, settle)
        # Leaving the block with an exception before the response ended applies the failure
        # policy (release); after it ended, the exception is the app's own and propagates.
        async with execution:
            await self.app(inner_scope, replay_receive, recorder)
            if not recorder.ended:
                # The app returned without finishing its response: pass on what it sent; the
                # key is released as the block ends without a settlement.
                logger.warning(
                    "response to %s %s under Idempotency-Key %r was incomplete: not recorded,"
                    " key released",
                    scope.get("method"),
                    scope.get("path"),
                    execution.key,
                )
                await recorder.flush()


OnEnd = Callable[["_Captured | None", str], Awaitable[None]]


class _Recorder:
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
                captured = _Captured(self._status, self._headers, b"".join(self._chunks))
                self._chunks.clear()
                await self._on_end(captured, "")
                await _send_response(self._send, captured.status, captured.headers, captured.body)
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
