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
import hashlib
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.errors import (
    CanonicalizationError,
    ConfigurationError,
    ConflictError,
    IdemstoreError,
    InProgressError,
    InvalidKeyError,
)
from idemstore.hashing import fingerprint
from idemstore.records import MAX_KEY_LENGTH, MAX_SCOPE_LENGTH, check_identity
from idemstore.runner import Idempotency

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

# RFC 8941 sf-string: printable ASCII, with only \" and \\ escaped.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
# A bare value: RFC 8941 token characters, but a leading digit is allowed too, because
# clients commonly send bare UUIDs.
_BARE = re.compile(r"[A-Za-z0-9*!#$%&'+\-.^_`|~:/]+")
# Parameters after an sf-item (";a=1"); accepted and ignored.
_PARAMS = re.compile(r"(?:;\s*[a-z*][a-z0-9_\-.*]*(?:=[^;]*)?)*")

# Response extensions that would bypass ``send``'s body messages and so the recorder.
_BYPASS_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")

_FORMAT_VERSION = 1


class _ClientGone(Exception):
    """Internal: the client disconnected while the request body was being read."""


class _NotRecorded(Exception):
    """Internal: the response was sent but must not be stored; the key is released."""


def parse_idempotency_key(value: str) -> str:
    """The key in an ``Idempotency-Key`` field value: an sf-string, or a bare token.

    Raises ``ValueError`` saying what is wrong with ``value``.
    """
    text = value.strip(" \t")
    match = _SF_STRING.match(text)
    if match is not None:
        rest = text[match.end() :]
        if _PARAMS.fullmatch(rest) is None:
            raise ValueError("unexpected characters after the quoted key")
        return re.sub(r"\\(.)", r"\1", match.group(1))
    if text.startswith('"'):
        raise ValueError(
            "the quoted key is not a valid structured-field string (unterminated, or a"
            " character outside printable ASCII, or a backslash before something other than"
            ' " or \\)'
        )
    bare, _, params = text.partition(";")
    if not bare or _BARE.fullmatch(bare) is None:
        raise ValueError(
            'the key must be a quoted string such as "8e03978e-40d5-43e8-bc93-6894a57f9324"'
            " (RFC 8941) or a bare token"
        )
    if params and _PARAMS.fullmatch(";" + params) is None:
        raise ValueError("unexpected characters after the key")
    return bare


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


def _header_values(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def default_scope(scope: Scope) -> str | None:
    """The default caller boundary: who is calling, or ``None`` when nobody can tell.

    An authenticated ``scope["user"]`` (Starlette's ``AuthenticationMiddleware``) by its
    identity; else the credentials in the ``Authorization`` header, hashed (so a record is
    only ever matched by a request bearing the same credentials).
    """
    user = scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        identity = getattr(user, "identity", "") or getattr(user, "display_name", "")
        if identity:
            return f"user:{identity}"
    authorization = _header_values(scope, b"authorization")
    if authorization:
        digest = hashlib.sha256(b"\n".join(authorization)).hexdigest()
        return f"authorization-sha256:{digest}"
    return None


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


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
            ``default_scope`` (authenticated user, else a hash of the ``Authorization``
            header); a keyed request from a caller it cannot tell apart is refused with 400
            rather than matched against other anonymous callers' records. Return a constant
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
        "_required",
        "_runner",
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
        self._runner = Idempotency(
            store, lease_ttl=lease_ttl, retention=retention, in_flight="reject"
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
        values = _header_values(scope, HEADER)
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
        if len(caller) > MAX_SCOPE_LENGTH:
            caller = "sha256:" + hashlib.sha256(caller.encode("utf-8")).hexdigest()

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
        print_ = self._fingerprint(scope, body)
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

    @staticmethod
    def _fingerprint(scope: Scope, body: bytes) -> str:
        content_type = b", ".join(_header_values(scope, b"content-type"))
        payload: dict[str, Any] = {"sha256": hashlib.sha256(body).hexdigest()}
        if body and _is_json(content_type):
            try:
                # JSON bodies compare as parsed values: key order, whitespace and escapes or
                # 1 vs 1.0 make no difference.
                payload = {"json": json.loads(body)}
                return fingerprint(_request_identity(scope, payload))
            except (ValueError, CanonicalizationError, RecursionError):
                payload = {"sha256": hashlib.sha256(body).hexdigest()}
        return fingerprint(_request_identity(scope, payload))

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
        recorder = _Recorder(send, self.max_response_bytes)
        ran = False

        async def work() -> bytes:
            nonlocal ran
            await self.app(inner_scope, replay_receive, recorder)
            ran = True
            if not recorder.complete and not recorder.streamed:
                # The app ended without finishing its response: pass on what it sent.
                await recorder.flush("incomplete")
            captured = recorder.result()
            if captured is None:
                logger.warning(
                    "response to %s %s under Idempotency-Key %r was %s: sent but not"
                    " recorded, key released",
                    scope.get("method"),
                    scope.get("path"),
                    key,
                    recorder.why_not,
                )
                raise _NotRecorded
            if captured.status >= 500 and not self.record_server_errors:
                raise _NotRecorded
            return captured.encode()

        try:
            result = await self._runner.run(key, print_, work, scope=caller)
        except _NotRecorded:
            # The key is released by now, so a client that retries on seeing the end of this
            # response finds it free.
            await recorder.finish()
            return
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
            if ran:
                logger.warning(
                    "response under Idempotency-Key %r could not be recorded: %s", key, exc
                )
                await recorder.finish()
                return
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
        if not result.replayed:
            await recorder.finish()
            return
        try:
            recorded = _Captured.decode(result.value)
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


def _request_identity(scope: Scope, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "method": scope.get("method", "").upper(),
        "path": scope.get("path", ""),
        "query": scope.get("query_string", b"").decode("latin-1"),
        "body": payload,
    }


class _Recorder:
    """An ASGI ``send`` that buffers the response, up to a size, instead of sending it.

    Past the limit, or for an event stream, it sends what it holds and passes the rest
    through (``streamed``); ``result()`` is then ``None``. The message that ends the response
    is held back either way until ``finish()``, so the response only completes for the client
    once the store has recorded it or released the key.
    """

    __slots__ = (
        "_chunks",
        "_final",
        "_headers",
        "_limit",
        "_send",
        "_size",
        "_status",
        "complete",
        "streamed",
        "why_not",
    )

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._final: Message | None = None
        self.streamed = False
        self.complete = False
        self.why_not = ""

    async def __call__(self, message: Message) -> None:
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
                self.complete = True
            return
        # Anything else (trailers, an extension) cannot be recorded faithfully.
        await self._stream(f"using {kind!r}")
        await self._pass(message)

    async def _pass(self, message: Message) -> None:
        """Send ``message`` on, except the one that ends the response: ``finish`` sends it."""
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._final = message
            return
        await self._send(message)

    async def finish(self) -> None:
        """Complete the response to the client: the buffered one, or the end of the stream."""
        if self.streamed:
            final, self._final = self._final, None
            if final is not None:
                await self._send(final)
            return
        if self.complete:
            await _send_response(self._send, self._status, self._headers, b"".join(self._chunks))

    async def flush(self, why: str) -> None:
        """Send what is held and stop recording."""
        await self._stream(why)

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

    def result(self) -> _Captured | None:
        if self.streamed or not self.complete:
            return None
        return _Captured(self._status, self._headers, b"".join(self._chunks))
