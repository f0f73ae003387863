"""HTTP ``Idempotency-Key`` for Django, configured from settings, for sync and async views.

Add ``"idemstore.django.IdempotencyMiddleware"`` to ``MIDDLEWARE`` (after the authentication
middleware: the caller is the authenticated user) and configure it in settings::

    IDEMSTORE = {"STORE": "redis://localhost:6379/0", "REQUIRED": ["/payments/*"]}

The keys are the options of ``idemstore.asgi.IdempotencyMiddleware`` in upper case, whose
rules this middleware runs rather than copies (status codes, ``Idempotent-Replayed``, the
request fingerprint, problem bodies, the record format), on a private event-loop thread as
``idemstore.wsgi`` does. ``SCOPE`` is a function (or its dotted path) given the request and
returning the caller's boundary or ``None``; by default the authenticated user
(``user:<pk>``), else a hash of the ``Authorization`` header and the cookies, else nobody
(a keyed request is then refused with 400).

``@idempotency_key_required`` and ``@idempotency_key_exempt`` mark a view: a key is required
there (400 without one), or the view ignores keys altogether.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any, TypeVar

from idemstore.errors import ConfigurationError, MissingDependencyError

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
    from django.urls import Resolver404, resolve
    from django.utils.module_loading import import_string
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.django needs Django: pip install 'idemstore[django]'"
    ) from exc

from idemstore.asgi import HEADER
from idemstore.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.asgi_options import method_set, required_predicate
from idemstore.http_identity import default_scope
from idemstore.loop_thread import LoopThread, in_calling_thread, loop_over_store
from idemstore.wsgi import asgi_scope

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "IdempotencyMiddleware",
    "close_stores",
    "idempotency_key_exempt",
    "idempotency_key_required",
    "user_scope",
]

V = TypeVar("V", bound="Callable[..., Any]")

_MARK = "idemstore_key"
# What travels inside the ASGI scope handed to the ASGI middleware.
_CALLER = "idemstore.django.caller"
_VIEW = "idemstore.django.view"
_REQUIRED = "idemstore.django.required"

_Parts = tuple[int, list[tuple[bytes, bytes]], bytes]


def idempotency_key_required(view: V) -> V:
    """This view needs an ``Idempotency-Key`` (400 without one) on the configured methods."""
    setattr(view, _MARK, "required")
    return view


def idempotency_key_exempt(view: V) -> V:
    """This view ignores ``Idempotency-Key``: every request runs it."""
    setattr(view, _MARK, "exempt")
    return view


def user_scope(request: HttpRequest) -> str | None:
    """The default caller boundary: ``user:<pk>`` of an authenticated ``request.user``, else
    the ASGI middleware's default (a hash of ``Authorization`` and the cookies), else
    ``None``."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return default_scope(asgi_scope(request.META))


def _options() -> dict[str, Any]:
    configured = getattr(settings, "IDEMSTORE", None)
    if not isinstance(configured, dict) or "STORE" not in configured:
        raise ImproperlyConfigured(
            'idemstore.django needs settings.IDEMSTORE = {"STORE": "<store URL>", ...}'
        )
    known = set(inspect.signature(ASGIIdempotencyMiddleware).parameters) - {"app"}
    options = {str(name).lower(): value for name, value in configured.items()}
    unknown = sorted(set(options) - known - {"store_options"})
    if unknown:
        raise ImproperlyConfigured(
            f"settings.IDEMSTORE has unknown keys {unknown}; known:"
            f" {sorted(name.upper() for name in known | {'store_options'})}"
        )
    return options


_DOORS: dict[str, LoopThread[ASGIIdempotencyMiddleware]] = {}
_DOORS_LOCK = threading.Lock()


def _door(options: dict[str, Any]) -> LoopThread[ASGIIdempotencyMiddleware]:
    """One loop and store per process and configuration (Django builds a middleware per
    handler: the test client, one per client)."""
    identity = repr(sorted(options.items()))
    with _DOORS_LOCK:
        door = _DOORS.get(identity)
        if door is None:
            store, store_options = options.pop("store"), options.pop("store_options", None)

            def make(opened: IdempotencyStore) -> ASGIIdempotencyMiddleware:
                return ASGIIdempotencyMiddleware(
                    _view, store=opened, scope=_caller_of, required=_required_of, **options
                )

            try:
                door = loop_over_store(store, store_options, make, name="idemstore-django")
            except (ConfigurationError, TypeError) as exc:
                raise ImproperlyConfigured(f"settings.IDEMSTORE: {exc}") from exc
            _DOORS[identity] = door
        return door


def close_stores() -> None:
    """Close every store the middleware opened in this process (at shutdown, in tests)."""
    with _DOORS_LOCK:
        doors = list(_DOORS.values())
        _DOORS.clear()
    for door in doors:
        door.close()


def _required_of(scope: MutableMapping[str, Any]) -> bool:
    required: bool = scope[_REQUIRED]
    return required


def _caller_of(scope: MutableMapping[str, Any]) -> str | None:
    caller: str | None = scope[_CALLER]
    return caller


async def _view(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """The ASGI middleware's inner app: the Django view, run where Django runs it."""
    status, headers, body = await scope[_VIEW]()
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _head(response: HttpResponseBase) -> tuple[int, list[tuple[bytes, bytes]]]:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    for morsel in response.cookies.values():
        headers.append((b"set-cookie", morsel.OutputString().encode("latin-1")))
    return response.status_code, headers


def _parts(response: HttpResponseBase) -> _Parts:
    status, headers = _head(response)
    if isinstance(response, StreamingHttpResponse):
        # Recorded before the client sees it: a keyed request's stream is buffered.
        body = b"".join(response.streaming_content)
    else:
        body = response.content
    response.close()
    return status, headers, body


async def _aparts(response: HttpResponseBase) -> _Parts:
    if isinstance(response, StreamingHttpResponse) and response.is_async:
        status, headers = _head(response)
        body = b"".join([bytes(chunk) async for chunk in response.streaming_content])
        return status, headers, body
    return _parts(response)


def _django_response(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> HttpResponse:
    response = HttpResponse(body, status=status)
    for name, value in headers:
        text = value.decode("latin-1")
        if name == b"set-cookie":
            response.cookies.load(SimpleCookie(text))
        else:
            response[name.decode("latin-1")] = text
    return response


class IdempotencyMiddleware:
    """Django middleware honouring ``Idempotency-Key`` (see the module docstring)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)
        options = _options()
        scope = options.pop("scope", None)
        if isinstance(scope, str):
            scope = import_string(scope)
        if scope is not None and not callable(scope):
            raise ImproperlyConfigured(f"settings.IDEMSTORE['SCOPE'] is not callable: {scope!r}")
        self._scope: Callable[[HttpRequest], str | None] = scope or user_scope
        required = options.pop("required", False)
        try:
            self._methods = method_set(options.get("methods", ("POST", "PATCH")))
            # A predicate of the settings is given the request; patterns match its path.
            by_request = callable(required) and not isinstance(required, bool)
            self._required = required if by_request else required_predicate(required)
        except (ConfigurationError, TypeError) as exc:
            raise ImproperlyConfigured(f"settings.IDEMSTORE: {exc}") from exc
        self._by_request = by_request
        self._door = _door(options)

    def _keyed(self, request: HttpRequest) -> MutableMapping[str, Any] | None:
        """The request's ASGI scope when the key concerns it, else ``None``."""
        if str(request.method).upper() not in self._methods:
            return None
        try:
            mark = getattr(resolve(request.path_info).func, _MARK, None)
        except Resolver404:
            mark = None
        if mark == "exempt":
            return None
        scope = asgi_scope(request.META)
        scope["path"] = request.path
        scope.pop("user", None)
        scope[_REQUIRED] = mark == "required" or bool(
            self._required(request if self._by_request else scope)
        )
        if not scope[_REQUIRED] and not any(name == HEADER for name, _ in scope["headers"]):
            return None
        return scope

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self.__acall__(request)
        scope = self._keyed(request)
        if scope is None:
            return self.get_response(request)
        scope[_CALLER] = self._scope(request)
        scope[_VIEW] = lambda: in_calling_thread(lambda: _parts(self.get_response(request)))
        return _django_response(*self._door.call(_through(scope, request.body)))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        scope = self._keyed(request)
        if scope is None:
            return await self.get_response(request)
        if self._scope is user_scope and hasattr(request, "auser"):
            # request.user would query the database from async code; auser() may.
            user = await request.auser()
            if user.is_authenticated:
                scope[_CALLER] = f"user:{user.pk}"
            else:
                scope[_CALLER] = default_scope(asgi_scope(request.META))
        else:
            scope[_CALLER] = await sync_to_async(self._scope)(request)
        here = asyncio.get_running_loop()
        view: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response

        async def on_server_loop() -> _Parts:
            return await _aparts(await view(request))

        async def run_view() -> _Parts:
            # The view runs on the server's loop; the store's calls on the door's.
            running = asyncio.run_coroutine_threadsafe(on_server_loop(), here)
            return await asyncio.wrap_future(running)

        scope[_VIEW] = run_view
        answered = self._door.submit(_through(scope, request.body))
        return _django_response(*await asyncio.wrap_future(answered))


def _through(
    scope: MutableMapping[str, Any], body: bytes
) -> Callable[[ASGIIdempotencyMiddleware], Awaitable[_Parts]]:
    """Run the request through the ASGI middleware; what it answers, as parts."""

    async def answer(middleware: ASGIIdempotencyMiddleware) -> _Parts:
        status, headers, chunks = 500, [], []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        await middleware(scope, receive, send)
        return status, headers, b"".join(chunks)

    return answer
