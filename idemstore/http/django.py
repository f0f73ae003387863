"""HTTP ``Idempotency-Key`` for Django, configured from settings, for sync and async views.

Add ``"idemstore.http.django.IdempotencyMiddleware"`` to ``MIDDLEWARE`` (after the authentication
middleware: the caller is the authenticated user) and configure it in settings::

    IDEMSTORE = {"STORE": "redis://localhost:6379/0", "REQUIRED": ["/payments/*"]}

The keys are the options of ``idemstore.http.asgi.IdempotencyMiddleware`` in upper case, whose
rules this middleware runs rather than copies (status codes, ``Idempotent-Replayed``, the
request fingerprint, problem bodies, the record format), on a private event-loop thread as
``idemstore.http.wsgi`` does. The caller is, in this order: what ``CALLER`` (a function or its
dotted path, given the request) returns (a ``Principal``, a string: realm ``app``, or
``None``); the authenticated ``request.user`` by its pk (realm ``django-user``);
``REMOTE_USER`` when ``TRUST_REMOTE_USER`` is set (realm ``remote-user``); the credentials
``CALLER_SOURCES`` names (default ``Authorization`` and ``Proxy-Authorization``); else nobody
(a keyed request is then refused with 400).

``@idempotency_key_required`` and ``@idempotency_key_exempt`` mark a view: a key is required
there (400 without one), or the view ignores keys altogether.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from idemstore.errors import ConfigurationError, MissingDependencyError
from idemstore.install_lines import install_hint

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.urls import Resolver404, resolve
    from django.utils.module_loading import import_string
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.http.django needs Django: " + install_hint("django")
    ) from exc

from idemstore.callers import DEFAULT_SOURCES, Principal
from idemstore.http.asgi import DELEGATED_PRINCIPAL, HEADER, delegated_principal
from idemstore.http.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.http.callers import CallerRule
from idemstore.http.django_responses import (
    VIEW,
    Opened,
    aresponse_of,
    opened_async,
    opened_sync,
    response_of,
    view_app,
)
from idemstore.http.options import method_set, required_predicate
from idemstore.http.wsgi import REMOTE_USER_REALM, asgi_scope
from idemstore.loop_thread import LoopThread, hand_over, in_calling_thread, loop_over_store

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from django.http import HttpRequest, HttpResponseBase

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "DJANGO_USER_REALM",
    "IdempotencyMiddleware",
    "close_stores",
    "django_user",
    "idempotency_key_exempt",
    "idempotency_key_required",
]

V = TypeVar("V", bound="Callable[..., Any]")

DJANGO_USER_REALM = "django-user"
"""The realm of a Django user's pk: a pk is not a ``REMOTE_USER`` login name."""

_MARK = "idemstore_key"
# What travels inside the ASGI scope handed to the ASGI middleware.
_REQUIRED = "idemstore.http.django.required"


def idempotency_key_required(view: V) -> V:
    """This view needs an ``Idempotency-Key`` (400 without one) on the configured methods."""
    setattr(view, _MARK, "required")
    return view


def idempotency_key_exempt(view: V) -> V:
    """This view ignores ``Idempotency-Key``: every request runs it."""
    setattr(view, _MARK, "exempt")
    return view


def django_user(user: object) -> Principal | None:
    """The principal of an authenticated Django user: its pk in realm ``django-user``."""
    try:
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        pk = getattr(user, "pk", None)
    except (AttributeError, NotImplementedError):
        return None
    return Principal.of(DJANGO_USER_REALM, None if pk is None else str(pk))


def _options() -> dict[str, Any]:
    configured = getattr(settings, "IDEMSTORE", None)
    if not isinstance(configured, dict) or "STORE" not in configured:
        raise ImproperlyConfigured(
            'idemstore.http.django needs settings.IDEMSTORE = {"STORE": "<store URL>", ...}'
        )
    known = set(inspect.signature(ASGIIdempotencyMiddleware).parameters) - {"app"}
    options = {str(name).lower(): value for name, value in configured.items()}
    known |= {"store_options", "trust_remote_user"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.IDEMSTORE has unknown keys {unknown}; known:"
            f" {sorted(name.upper() for name in known)}"
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
                    view_app,
                    store=opened,
                    caller=delegated_principal,
                    required=_required_of,
                    **options,
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
        caller = options.pop("caller", None)
        if isinstance(caller, str):
            caller = import_string(caller)
        self._trust_remote_user = options.pop("trust_remote_user", False)
        if not isinstance(self._trust_remote_user, bool):
            raise ImproperlyConfigured("settings.IDEMSTORE['TRUST_REMOTE_USER'] is True or False")
        required = options.pop("required", False)
        try:
            door = "request.user.pk" + (", else REMOTE_USER" if self._trust_remote_user else "")
            sources = options.get("caller_sources", DEFAULT_SOURCES)
            self._callers = CallerRule(caller, sources, door=door)
            self._methods = method_set(options.get("methods", ("POST", "PATCH")))
            # A predicate of the settings is given the request; patterns match its path.
            by_request = callable(required) and not isinstance(required, bool)
            self._required = required if by_request else required_predicate(required)
        except (ConfigurationError, TypeError) as exc:
            raise ImproperlyConfigured(f"settings.IDEMSTORE: {exc}") from exc
        self._by_request = by_request
        self._door = _door(options)
        self._callers.log()

    def _principal(self, request: HttpRequest, user: object) -> Principal | None:
        """The ``CALLER`` function's principal, else ``user``'s, else a trusted
        ``REMOTE_USER``'s."""
        principal = self._callers.principal(request) or django_user(user)
        if principal is None and self._trust_remote_user:
            principal = Principal.of(REMOTE_USER_REALM, request.META.get("REMOTE_USER"))
        return principal

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
        scope[DELEGATED_PRINCIPAL] = self._principal(request, getattr(request, "user", None))
        scope[VIEW] = lambda: in_calling_thread(lambda: opened_sync(self.get_response(request)))
        return response_of(self._door.stream(_through(scope, request.body, hand_over)))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        scope = self._keyed(request)
        if scope is None:
            return await self.get_response(request)
        # request.user would query the database from async code; auser() may.
        auser = getattr(request, "auser", None)
        user = await auser() if auser is not None else getattr(request, "user", None)
        principal = await sync_to_async(self._principal)(request, user)
        scope[DELEGATED_PRINCIPAL] = principal
        here = asyncio.get_running_loop()
        view: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response

        async def on_server_loop() -> Opened:
            return await opened_async(await view(request), here)

        async def run_view() -> Opened:
            # The view runs on the server's loop; the store's calls on the door's.
            running = asyncio.run_coroutine_threadsafe(on_server_loop(), here)
            return await asyncio.wrap_future(running)

        # One message at a time: a slow client holds the request back, not the door's loop.
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1)

        async def deliver(message: MutableMapping[str, Any]) -> None:
            put = asyncio.run_coroutine_threadsafe(messages.put(dict(message)), here)
            await asyncio.wrap_future(put)

        scope[VIEW] = run_view
        answered = asyncio.wrap_future(self._door.submit(_through(scope, request.body, deliver)))
        return await aresponse_of(messages, answered)


def _through(
    scope: MutableMapping[str, Any],
    body: bytes,
    deliver: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> Callable[[ASGIIdempotencyMiddleware], Awaitable[None]]:
    """Run the request through the ASGI middleware, each message it sends ``deliver``ed."""

    async def answer(middleware: ASGIIdempotencyMiddleware) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        await middleware(scope, receive, deliver)

    return answer
