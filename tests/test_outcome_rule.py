"""One outcome rule for every door (issue 42): work that ran but whose result cannot be
recorded (here: larger than the door's recording limit) runs once, its first caller gets the
result, and every retry under its key gets the shared ``outcome_unrecorded`` refusal.

``DOORS`` maps a door's name to a driver; the MCP doors join the rule by adding theirs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, NamedTuple

import pytest

from idemstore import Idempotency, open_store
from idemstore.execution.refusals import Refusal, refusal_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    import httpx

LIMIT = 1000
SIZE = 5000
RETRIES = 2


class Door(NamedTuple):
    """``call(key)``: run the oversized work under ``key`` through the door; ``None`` when its
    caller got the result, else the refusal it got. ``runs()``: how often the work ran."""

    call: Callable[[str], Awaitable[Refusal | None]]
    runs: Callable[[], int]


def _http_refusal(status: int, document: dict[str, object] | None) -> Refusal | None:
    if status < 400:
        return None
    assert document is not None
    kind = str(document["type"]).rpartition("#")[2]
    assert f"{SIZE}" in str(document["detail"]) and f"{LIMIT} bytes" in str(document["detail"])
    return Refusal(kind)


def _refusal_of(exc: Exception) -> Refusal:
    refusal = refusal_of(exc)
    assert refusal is not None, exc
    return refusal


@contextlib.asynccontextmanager
async def runner_door() -> AsyncIterator[Door]:
    ran: list[int] = []

    async def work() -> bytes:
        ran.append(1)
        return b"x" * SIZE

    async with open_store("memory://") as store:
        idem = Idempotency(store, max_response_bytes=LIMIT)

        async def call(key: str) -> Refusal | None:
            try:
                result = await idem.run(key, "fp", work)
            except Exception as exc:
                return _refusal_of(exc)
            assert len(result.value) == SIZE
            return None

        yield Door(call, lambda: len(ran))


@contextlib.asynccontextmanager
async def celery_door() -> AsyncIterator[Door]:
    from idemstore.consumers.celery import idempotent_task
    from idemstore.sync import Idempotency as SyncIdempotency

    ran: list[int] = []
    with SyncIdempotency("memory://", max_response_bytes=LIMIT) as idem:

        @idempotent_task(idem, key=lambda order: order)
        def report(order: str) -> str:
            ran.append(1)
            return "x" * SIZE

        async def call(key: str) -> Refusal | None:
            try:
                assert len(await asyncio.to_thread(report, key)) == SIZE
            except Exception as exc:
                return _refusal_of(exc)
            return None

        yield Door(call, lambda: len(ran))


def _asgi_door(framework: str) -> Callable[[], contextlib.AbstractAsyncContextManager[Door]]:
    @contextlib.asynccontextmanager
    async def door() -> AsyncIterator[Door]:
        from tests.http.apps import create_app
        from tests.http.conftest import calls, client_of, keyed

        store = open_store("memory://")
        app = create_app(framework, store, max_response_bytes=LIMIT)
        client: httpx.AsyncClient
        async with store, client_of(app) as client:

            async def call(key: str) -> Refusal | None:
                answer = await client.post(f"/big?size={SIZE - 1}", headers=keyed(key))
                document = answer.json() if answer.status_code >= 400 else None
                return _http_refusal(answer.status_code, document)

            yield Door(call, lambda: calls(app, "big"))

    return door


@contextlib.asynccontextmanager
async def wsgi_door() -> AsyncIterator[Door]:
    from werkzeug.test import Client

    from idemstore.http.wsgi import IdempotencyMiddleware
    from tests.wsgi.apps import orders_app

    app = orders_app()
    with IdempotencyMiddleware(
        app.wsgi_app, store="memory://", max_response_bytes=LIMIT
    ) as wrapped:
        client = Client(wrapped)

        async def call(key: str) -> Refusal | None:
            headers = {"Authorization": "Bearer alice", "Idempotency-Key": f'"{key}"'}
            answer = await asyncio.to_thread(client.post, f"/big?size={SIZE}", headers=headers)
            document = answer.get_json() if answer.status_code >= 400 else None
            return _http_refusal(answer.status_code, document)

        yield Door(call, lambda: int(app.config["count"]))


@contextlib.asynccontextmanager
async def django_door() -> AsyncIterator[Door]:
    from tests.django_middleware.project import EFFECTS, configure

    configure()
    from django.test import Client, override_settings

    from idemstore.http.django import close_stores

    EFFECTS.pop("big", None)
    settings = {"STORE": "memory://", "MAX_RESPONSE_BYTES": LIMIT}
    try:
        with override_settings(IDEMSTORE=settings):
            client = Client()

            async def call(key: str) -> Refusal | None:
                headers = {"X-Test-User": "alice", "Idempotency-Key": f'"{key}"'}
                answer = await asyncio.to_thread(client.post, f"/big?size={SIZE}", headers=headers)
                document = answer.json() if answer.status_code >= 400 else None
                return _http_refusal(answer.status_code, document)

            yield Door(call, lambda: EFFECTS.get("big", 0))
    finally:
        close_stores()


DOORS: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[Door]]] = {
    "runner": runner_door,
    "celery": celery_door,
    "asgi": _asgi_door("starlette"),
    "fastapi": _asgi_door("fastapi"),
    "wsgi": wsgi_door,
    "django": django_door,
}


@pytest.mark.parametrize("door", sorted(DOORS))
async def test_work_whose_result_cannot_be_recorded_runs_once_and_every_retry_is_refused(
    door: str,
) -> None:
    key = f"unrecorded-{uuid.uuid4().hex[:8]}"
    async with DOORS[door]() as through:
        assert await through.call(key) is None  # the first caller got the result
        for _ in range(RETRIES):
            assert await through.call(key) is Refusal.OUTCOME_UNRECORDED
        assert through.runs() == 1
