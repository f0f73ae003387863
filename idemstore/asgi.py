"""HTTP ``Idempotency-Key`` (draft-ietf-httpapi-idempotency-key-header) for any ASGI app.

``IdempotencyMiddleware(app, store=..., **options)`` is pure ASGI: it works under Starlette's
``app.add_middleware(IdempotencyMiddleware, store=store)``, FastAPI, or wrapped around any ASGI
callable. A keyed request runs once per ``(scope, key)``; a retry with the same request gets
the recorded response plus ``Idempotent-Replayed: true``; other outcomes, as the draft says:

- key missing where required: 400; key reused with a different request: 422;
- a request with the same key still in progress: 409 (with ``Retry-After``);

each as ``application/problem+json`` with a ``detail`` that says what to do.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.callers import fit_scope
from idemstore.errors import (
    ConfigurationError,
    ConflictError,
    IdemstoreError,
    InProgressError,
    InvalidKeyError,
)
from idemstore.execution import Execution, ExecutionPolicy, Replay
from idemstore.http_identity import (
    default_scope,
    header_values,
    parse_idempotency_key,
    request_fingerprint,
)
from idemstore.records import MAX_KEY_LENGTH, check_identity

if TYPE_CHECKING:
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

HEADER = b"idempotency-key"
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


def _problem(
    status: int, title: str, detail: str, *, key: str | None = None, retry_after: int | None = None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    document: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if key is not None:
        document["idempotencyKey"] = key
    body = json.dumps(document).encode("utf-8")
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode("ascii")))
    return status, headers, body


async def _send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on unsafe requests of an ASGI app.

    Args:
        app: the ASGI app to wrap.
        store: any ``IdempotencyStore``; several server processes need one they all share.
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
    """

    __slots__ = (
        "_max_key_length",
        "_methods",
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
        store: IdempotencyStore,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool | Iterable[str] | RoutePredicate = False,
        scope: ScopeFunction | None = None,
        retention: float = 86400.0,
        lease_ttl: float = 30.0,
        max_body_bytes: int = 1024 * 1024,
        max_response_bytes: int = 1024 * 1024,
        record_server_errors: bool = False,
        max_key_length: int = MAX_KEY_LENGTH,
    ) -> None:
        self.app = app
        self._policy = ExecutionPolicy(
            store, lease_ttl=lease_ttl, retention=retention, in_flight="reject", consumer="asgi"
        )
        if isinstance(methods, str):
            methods = (methods,)
        self._methods = frozenset(method.upper() for method in methods)
        self._required = self._required_predicate(required)
        if scope is not None and not callable(scope):
            raise ConfigurationError(f"scope must be a callable given the ASGI scope: {scope!r}")
        self._scope: ScopeFunction = scope if scope is not None else default_scope
        for name, value in (
            ("max_body_bytes", max_body_bytes),
            ("max_response_bytes", max_response_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative int, not {value!r}")
        self.max_body_bytes = max_body_bytes
        self.max_response_bytes = max_response_bytes
        self.record_server_errors = record_server_errors
        self._max_key_length = max_key_length

    @staticmethod
    def _required_predicate(required: bool | Iterable[str] | RoutePredicate) -> RoutePredicate:
        if isinstance(required, bool):
            flag = required
            return lambda _scope: flag
        if callable(required):
            return required
        if isinstance(required, str):
            required = (required,)
        patterns = tuple(required)
        return lambda scope: any(
            fnmatch.fnmatchcase(scope.get("path", ""), pattern) for pattern in patterns
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method", "").upper() not in self._methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, HEADER)
        if not values:
            if self._required(scope):
                await _send_response(
                    send,
                    *_problem(
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

    async def _keyed(self, scope: Scope, receive: Receive, send: Send, values: list[bytes]) -> None:
        if len(values) > 1:
            await _send_response(
                send,
                *_problem(
                    400,
                    "Invalid Idempotency-Key",
                    "The request carries more than one Idempotency-Key field; send exactly one.",
                ),
            )
            return
        try:
            key = parse_idempotency_key(values[0].decode("latin-1"))
            check_identity(key, "", max_key_length=self._max_key_length)
        except (ValueError, InvalidKeyError) as exc:
            await _send_response(
                send, *_problem(400, "Invalid Idempotency-Key", f"Idempotency-Key: {exc}.")
            )
            return
        caller = self._scope(scope)
        if inspect.isawaitable(caller):
            caller = await caller
        if caller is None:
            await _send_response(
                send,
                *_problem(
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
                *_problem(
                    413,
                    "Request body too large for an idempotent request",
                    f"Requests with an Idempotency-Key may carry at most {self.max_body_bytes}"
                    " bytes of body.",
                    key=key,
                ),
            )
            return
        print_ = request_fingerprint(scope, body)
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
        except InProgressError:
            await _send_response(
                send,
                *_problem(
                    409,
                    "Request in progress",
                    "A request with this Idempotency-Key is still being processed; retry after"
                    " a short delay to get its response.",
                    key=key,
                    retry_after=1,
                ),
            )
            return
        except ConflictError:
            await _send_response(
                send,
                *_problem(
                    422,
                    "Idempotency-Key reused",
                    "This Idempotency-Key was already used for a different request (method,"
                    " path, query or body differ); use a new key for a new request.",
                    key=key,
                ),
            )
            return
        except IdemstoreError as exc:
            logger.error("idempotency store failed before the request ran: %s", exc)
            await _send_response(
                send,
                *_problem(
                    503,
                    "Idempotency store unavailable",
                    "The request was not processed because its Idempotency-Key could not be"
                    " checked; retry later with the same key.",
                    key=key,
                    retry_after=1,
                ),
            )
            return
        if isinstance(claim, Replay):
            await self._replay(send, key, claim.response)
            return
        await self._execute(claim, scope, receive, send, body)

    async def _replay(self, send: Send, key: str, stored: bytes) -> None:
        try:
            recorded = _Captured.decode(stored)
        except (ValueError, KeyError, TypeError) as exc:
            logger.error("record for Idempotency-Key %r is unreadable: %s", key, exc)
            await _send_response(
                send,
                *_problem(
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
