"""A minimal Django project for the middleware tests: settings, a stand-in for the
authentication middleware, and views that count their side effects."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

from idemstore.http.django import idempotency_key_exempt, idempotency_key_required

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

EFFECTS: dict[str, int] = {}
PRODUCED: list[int] = []  # the events the streaming views yielded so far, in order
_LOCK = threading.Lock()


def configure(store_url: str | None = None) -> None:
    """Configure Django once per process (the store: ``IDEMSTORE_TEST_STORE`` or memory)."""
    if settings.configured:
        return
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        SECRET_KEY="idemstore-tests",
        ROOT_URLCONF=__name__,
        DATABASES={},
        INSTALLED_APPS=[],
        MIDDLEWARE=[
            f"{__name__}.HeaderUserMiddleware",
            "idemstore.http.django.IdempotencyMiddleware",
        ],
        IDEMSTORE={"STORE": store_url or os.environ.get("IDEMSTORE_TEST_STORE", "memory://")},
    )
    django.setup()


class _User:
    def __init__(self, name: str | None) -> None:
        self.pk = name
        self.is_authenticated = name is not None


class HeaderUserMiddleware:
    """Stands in for Django's authentication: ``X-Test-User`` names the logged-in user."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        user = _User(request.headers.get("X-Test-User"))
        request.user = user  # type: ignore[attr-defined]

        async def auser() -> _User:
            return user

        request.auser = auser  # type: ignore[attr-defined]
        return self.get_response(request)


def _effect(request: HttpRequest, name: str) -> int:
    with _LOCK:
        EFFECTS[name] = EFFECTS.get(name, 0) + 1
        count = EFFECTS[name]
    effects_file = os.environ.get("IDEMSTORE_TEST_EFFECTS")
    if effects_file:
        with Path(effects_file).open("a") as out:
            out.write(f"{request.headers.get('Idempotency-Key', '')} {os.getpid()}\n")
    return count


def orders(request: HttpRequest) -> HttpResponse:
    number = _effect(request, "orders")
    time.sleep(float(request.GET.get("sleep", "0")))
    return JsonResponse({"order": json.loads(request.body or b"null"), "n": number}, status=201)


async def async_orders(request: HttpRequest) -> HttpResponse:
    number = _effect(request, "async_orders")
    return JsonResponse({"order": json.loads(request.body or b"null"), "n": number}, status=201)


def big(request: HttpRequest) -> HttpResponse:
    """A response of ``?size=`` bytes."""
    _effect(request, "big")
    return HttpResponse(b"x" * int(request.GET.get("size", "100")))


def ticks(request: HttpRequest) -> StreamingHttpResponse:
    """``?events=`` server-sent events as a ``StreamingHttpResponse``."""
    number = _effect(request, "ticks")
    count = int(request.GET.get("events", "50"))

    def events() -> Iterator[bytes]:
        for i in range(count):
            PRODUCED.append(i)
            yield f"id: {i}\nevent: tick\ndata: execution {number} tick {i}\n\n".encode()

    return StreamingHttpResponse(events(), content_type="text/event-stream")


async def async_ticks(request: HttpRequest) -> StreamingHttpResponse:
    """``ticks`` as an async view with an async iterator."""
    number = _effect(request, "async_ticks")
    count = int(request.GET.get("events", "50"))

    async def events() -> AsyncIterator[bytes]:
        for i in range(count):
            PRODUCED.append(i)
            yield f"id: {i}\nevent: tick\ndata: execution {number} tick {i}\n\n".encode()

    return StreamingHttpResponse(events(), content_type="text/event-stream")


@idempotency_key_required
def payments(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"n": _effect(request, "payments")}, status=201)


@idempotency_key_exempt
def pings(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"n": _effect(request, "pings")})


urlpatterns = [
    path("orders", orders),
    path("async-orders", async_orders),
    path("payments", payments),
    path("pings", pings),
    path("big", big),
    path("ticks", ticks),
    path("async-ticks", async_ticks),
]


def wsgi_application() -> Any:
    """What gunicorn serves (``tests.django_middleware.project:wsgi_application()``)."""
    configure()
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def asgi_application() -> Any:
    """What uvicorn serves (``tests.django_middleware.project:asgi_application``, factory)."""
    configure()
    from django.core.asgi import get_asgi_application

    return get_asgi_application()
