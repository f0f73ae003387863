"""HTTP ``Idempotency-Key`` for Flask, Django-as-WSGI and any WSGI app.

``IdempotencyMiddleware(app, store=url)`` wraps a WSGI app with the ASGI middleware's rules,
not a copy of them: a keyed request is turned into an ASGI request and handed to
``idemstore.http.asgi.IdempotencyMiddleware`` on a private event loop (``idemstore.loop_thread``),
whose inner app hands the request back to the WSGI app in the server's own worker thread. So
the status codes (400, 409, 413, 422 as problem+json), ``Idempotent-Replayed``, the request
fingerprint, the caller scope and the record format are the ASGI middleware's: an ASGI and a
WSGI deployment of one API may share a store.

Requests the key does not apply to (other methods; no key where none is required) go
straight to the app, streamed, without touching the loop. A keyed request's response is sent
as the app yields it (through the server's ``write()``) and recorded as it goes; one larger
than ``max_response_bytes`` is sent but not recorded, and its retries get 409 "Outcome not
recorded" (``on_unrecorded``).
"""

from __future__ import annotations

import http
import io
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Unpack

from idemstore.callers import DEFAULT_SOURCES, Principal
from idemstore.fingerprint_fields import readable_again
from idemstore.forwarded_options import reject_unknown
from idemstore.http.asgi import DELEGATED_PRINCIPAL, HEADER, delegated_principal
from idemstore.http.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.http.callers import CallerRule
from idemstore.http.options import KeyedRequestOptions, method_set, required_predicate
from idemstore.loop_thread import LoopOwner, LoopThread, in_calling_thread, loop_over_store

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

    from idemstore.protocol import IdempotencyStore

__all__ = ["REMOTE_USER_REALM", "IdempotencyMiddleware"]

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
EnvironCaller = Callable[[Environ], "Principal | str | None"]
EnvironPredicate = Callable[[Environ], bool]

# Where the WSGI environ travels inside the ASGI scope handed to the ASGI middleware.
_ENVIRON = "idemstore.http.wsgi.environ"

REMOTE_USER_REALM = "remote-user"
"""The realm of ``REMOTE_USER`` (a server's or an outer middleware's login name)."""


def asgi_scope(environ: Environ) -> dict[str, Any]:
    """The ASGI HTTP scope of a WSGI request (the headers the environ carries, in its order)."""
    headers: list[tuple[bytes, bytes]] = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            field_name = name[5:].replace("_", "-").lower()
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            field_name = name.replace("_", "-").lower()
        else:
            continue
        if value:
            headers.append((field_name.encode("latin-1"), str(value).encode("latin-1")))
    # PEP 3333 hands the path over as latin-1-decoded bytes; ASGI as UTF-8 text.
    raw_path = environ.get("PATH_INFO", "").encode("latin-1")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": environ.get("SERVER_PROTOCOL", "HTTP/1.1").partition("/")[2] or "1.1",
        "method": environ.get("REQUEST_METHOD", "GET").upper(),
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "path": raw_path.decode("utf-8", "replace"),
        "raw_path": raw_path,
        "root_path": environ.get("SCRIPT_NAME", "").encode("latin-1").decode("utf-8", "replace"),
        "query_string": environ.get("QUERY_STRING", "").encode("latin-1"),
        "headers": headers,
        _ENVIRON: environ,
    }
    return scope


@dataclass(slots=True)
class _Response:
    status: int = 500
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    started: bool = False


def _read_body(environ: Environ, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of the body: enough to tell that it is too large."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0:
        # No length: only a server that says the stream ends (chunked bodies) can be read.
        return bytes(stream.read(limit + 1)) if environ.get("wsgi.input_terminated") else b""
    return bytes(stream.read(min(length, limit + 1)))


def _asgi_bridge(app: WSGIApp) -> Callable[..., Awaitable[None]]:
    """An ASGI app that runs the WSGI ``app`` in the calling (server) thread, with the body
    the ASGI middleware read, and sends its response chunk by chunk as the app yields it."""

    async def bridge(asgi: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        environ = dict(asgi[_ENVIRON])
        chunks: list[bytes] = []
        while True:  # the ASGI middleware replays the body it read, in one message
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        response = _Response()
        iterable = await in_calling_thread(lambda: app(environ, _start_response(response)))
        iterator = iter(iterable)
        try:
            # The first chunk first: an app may call start_response only when iterated.
            chunk = await in_calling_thread(lambda: _next_chunk(iterator, response))
            start = {"status": response.status, "headers": response.headers}
            await send({"type": "http.response.start", **start})
            while chunk is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await in_calling_thread(lambda: _next_chunk(iterator, response))
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                await in_calling_thread(close)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return bridge


def _start_response(response: _Response) -> StartResponse:
    """The ``start_response`` of the WSGI app's call: it fills ``response``."""

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], object]:
        if exc_info is not None and response.started:
            raise exc_info[1].with_traceback(exc_info[2])
        response.status = int(status.split(" ", 1)[0])
        response.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return response.chunks.append  # the legacy write(): sent before the next chunk

    return start_response


def _next_chunk(iterator: Iterator[bytes], response: _Response) -> bytes | None:
    """The next bytes to send (what ``write()`` was given first), ``None`` at the end."""
    while True:
        if response.chunks:
            written = b"".join(response.chunks)
            response.chunks.clear()
            response.started = True
            return written
        chunk = next(iterator, None)
        if chunk is None:
            return None
        if chunk:
            response.started = True
            return bytes(chunk)


class IdempotencyMiddleware(LoopOwner):
    """Honour ``Idempotency-Key`` on unsafe requests of a WSGI app.

    Args:
        app: the WSGI app to wrap (``flask_app.wsgi_app = IdempotencyMiddleware(flask_app.wsgi_app,
            store=...)`` for Flask).
        store: a store URL (every worker process of the server must reach the same store:
            Redis, PostgreSQL, SQLite on one host, DynamoDB), or a zero-argument callable
            returning an ``IdempotencyStore`` (called on the middleware's own event loop, once
            per process).
        store_options: engine options for a URL.
        caller: a callable given the WSGI environ returning the caller: a ``Principal``, a
            string (realm ``app``) or ``None``. Asked first; ``None`` falls through to
            ``REMOTE_USER`` (when ``trust_remote_user``), then to ``caller_sources``.
        trust_remote_user: the server (or a middleware in front of this one) authenticates
            requests and sets ``REMOTE_USER``: it names the caller (realm ``remote-user``).
            Off by default: a WSGI server may pass a client-controlled value there.
        required: ``True``, path patterns (``fnmatch``), or a predicate given the environ.

    ``caller_sources``, ``methods``, ``retention``, ``lease_ttl``, ``max_body_bytes``,
    ``max_response_bytes``, ``record_server_errors``, ``on_unrecorded``, ``max_key_length``,
    ``on_takeover`` and the ``fingerprint_*`` options are the ASGI middleware's. The store is
    opened, and every option checked, by the constructor. ``close()`` (or ``with``) closes
    the store.
    """

    __slots__ = (
        "_callers",
        "_loop",
        "_methods",
        "_required",
        "_trust_remote_user",
        "app",
        "max_body_bytes",
    )
    _loop: LoopThread[ASGIIdempotencyMiddleware]

    def __init__(
        self,
        app: WSGIApp,
        *,
        store: str | Callable[[], IdempotencyStore],
        store_options: Mapping[str, Any] | None = None,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool | Iterable[str] | EnvironPredicate = False,
        caller: EnvironCaller | None = None,
        trust_remote_user: bool = False,
        **options: Unpack[KeyedRequestOptions],
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be a WSGI app (a callable), not {app!r}")
        reject_unknown(options, KeyedRequestOptions, "IdempotencyMiddleware()")
        self.app = app
        self._methods = method_set(methods)
        if not isinstance(trust_remote_user, bool):
            raise TypeError(f"trust_remote_user must be True or False: {trust_remote_user!r}")
        self._trust_remote_user = trust_remote_user
        by_environ = callable(required) and not isinstance(required, bool)
        predicate = required_predicate(required)
        # Path patterns and flags read the ASGI scope; a predicate of the user's, the environ.
        self._required: Callable[[MutableMapping[str, Any]], bool] = (
            (lambda s: bool(predicate(s[_ENVIRON]))) if by_environ else predicate
        )
        # Read again for the middleware of a forked child (a generator reads only once).
        kept: dict[str, Any] = {name: readable_again(value) for name, value in options.items()}
        door = "REMOTE_USER" if trust_remote_user else None
        self._callers = CallerRule(caller, kept.get("caller_sources", DEFAULT_SOURCES), door=door)
        bridge = _asgi_bridge(app)

        def make(opened: IdempotencyStore) -> ASGIIdempotencyMiddleware:
            return ASGIIdempotencyMiddleware(
                bridge,
                store=opened,
                methods=self._methods,
                required=self._required,
                caller=delegated_principal,
                **kept,
            )

        self._loop = loop_over_store(store, store_options, make, name="idemstore-wsgi")
        self._callers.log()
        # Checked, with its default, by the ASGI middleware.
        self.max_body_bytes = self._loop.resource.max_body_bytes

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method not in self._methods:
            return self.app(environ, start_response)
        scope = asgi_scope(environ)
        if not any(name == HEADER for name, _ in scope["headers"]) and not self._required(scope):
            return self.app(environ, start_response)
        scope[DELEGATED_PRINCIPAL] = self._principal(environ)
        body = _read_body(environ, self.max_body_bytes)
        sent = _Sent(start_response)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            # Each part goes to the server's thread (blocked in call) as it comes: the client
            # gets the response as the app produces it, and the recorder keeps its copy.
            if message["type"] == "http.response.start":
                status, headers = int(message["status"]), list(message.get("headers", ()))
                await in_calling_thread(lambda: sent.start(status, headers))
            elif message["type"] == "http.response.body" and message.get("body"):
                chunk = bytes(message["body"])
                await in_calling_thread(lambda: sent.write(chunk))

        self._loop.call(lambda middleware: middleware(scope, receive, send))
        return []

    def _principal(self, environ: Environ) -> Principal | None:
        """The ``caller`` option's principal, else ``REMOTE_USER``'s when trusted."""
        principal = self._callers.principal(environ)
        if principal is None and self._trust_remote_user:
            principal = Principal.of(REMOTE_USER_REALM, environ.get("REMOTE_USER"))
        return principal


class _Sent:
    """The server side of a keyed response: ``start_response``, then its ``write()``."""

    __slots__ = ("_start_response", "_write")

    def __init__(self, start_response: StartResponse) -> None:
        self._start_response = start_response
        self._write: Callable[[bytes], object] | None = None

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        self._write = self._start_response(_status_line(status), pairs)

    def write(self, chunk: bytes) -> None:
        assert self._write is not None, "the response starts before its body"
        self._write(chunk)


def _status_line(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"
