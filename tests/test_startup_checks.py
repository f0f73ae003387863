"""Deployment mistakes show when a door starts (issue 45, item 5): a process-local store
behind a server that forks workers is warned about; a missing schema stops the ASGI
lifespan, the synchronous doors and the consumers at startup, its message naming the
``?schema=`` looked in and the migrate command for it; the gateway's ``/readyz`` says so."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import SchemaError, open_store
from idemstore.backends.startup import server_workers, store_ready, warn_if_process_local
from idemstore.consumers.door import ConsumerDoor, handle_all
from idemstore.http.asgi import IdempotencyMiddleware
from idemstore.http.wsgi import IdempotencyMiddleware as WSGIMiddleware
from idemstore.runner import Idempotency

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each door warns once per process: every test starts as a new process would.
    monkeypatch.setattr("idemstore.backends.startup._warned", set())
    for name in ("WEB_CONCURRENCY", "GUNICORN_CMD_ARGS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("environ", "argv", "workers"),
    [
        ({}, ["/venv/bin/gunicorn", "-w", "2", "app:app"], 2),
        ({}, ["/venv/bin/gunicorn", "--workers=3", "app:app"], 3),
        ({}, ["/venv/bin/gunicorn", "-w4", "app:app"], 4),
        ({"GUNICORN_CMD_ARGS": "--bind :80 --workers 5"}, ["/venv/bin/gunicorn", "app"], 5),
        ({}, ["/venv/bin/uvicorn", "app:app", "--workers", "2"], 2),
        ({"WEB_CONCURRENCY": "2"}, ["/venv/bin/uvicorn", "app:app"], 2),
        ({}, ["manage.py", "runserver"], None),
        ({}, ["/venv/bin/uvicorn", "app:app"], None),
        ({}, ["worker.py", "-w", "9"], None),  # not a server: its -w means something else
    ],
)
def test_the_worker_count_is_read_where_the_server_says_it(
    environ: dict[str, str], argv: list[str], workers: int | None
) -> None:
    found = server_workers(environ, argv)
    assert (found and found[0]) == workers


def test_a_memory_store_behind_two_gunicorn_workers_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store("memory://")
    argv = ["/venv/bin/gunicorn", "-w", "2", "project.wsgi"]
    with caplog.at_level(logging.WARNING, logger="idemstore.startup"):
        assert warn_if_process_local(store, door="HTTP", environ={}, argv=argv) is True
        assert warn_if_process_local(store, door="HTTP", environ={}, argv=argv) is False
    (line,) = [r.getMessage() for r in caplog.records if r.name == "idemstore.startup"]
    assert "gunicorn -w 2" in line and "2 worker processes" in line and "runs its key again" in line


def test_a_shared_store_or_one_worker_is_not_warned_about(tmp_path: Path) -> None:
    shared = open_store(f"sqlite:///{tmp_path / 'idem.db'}")
    two = {"WEB_CONCURRENCY": "2"}
    assert warn_if_process_local(shared, door="HTTP", environ=two, argv=["x"]) is False
    one = {"WEB_CONCURRENCY": "1"}
    assert warn_if_process_local(open_store("memory://"), door="HTTP", environ=one) is False


def test_the_asgi_middleware_warns_at_construction_under_web_concurrency(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="idemstore.startup"):
        IdempotencyMiddleware(app, store="memory://")
    assert any("WEB_CONCURRENCY=4" in r.getMessage() for r in caplog.records)


async def lifespan_startup(middleware: IdempotencyMiddleware) -> dict[str, Any]:
    """What the server hears back for ``lifespan.startup``."""
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))

    await middleware({"type": "lifespan"}, receive, send)
    return sent[0]


async def lifespan_app(scope: Any, receive: Any, send: Any) -> None:
    """An app that speaks lifespan as frameworks do."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


async def test_the_asgi_lifespan_fails_startup_on_a_schema_never_migrated_naming_it(
    postgres_store_url: str, postgres_server: str
) -> None:
    # The operator migrated one schema (postgres_store_url's), the app names another.
    schema = f"never_{uuid.uuid4().hex[:8]}"
    middleware = IdempotencyMiddleware(lifespan_app, store=f"{postgres_server}?schema={schema}")
    try:
        answer = await lifespan_startup(middleware)
    finally:
        await middleware.close()
    assert answer["type"] == "lifespan.startup.failed"
    said = answer["message"]
    assert f"schema {schema!r}" in said and f"schema={schema}" in said
    assert "idemstore migrate" in said and "hold idemstore records" in said


async def test_the_asgi_lifespan_starts_on_a_migrated_store(postgres_store_url: str) -> None:
    middleware = IdempotencyMiddleware(lifespan_app, store=postgres_store_url)
    try:
        assert (await lifespan_startup(middleware))["type"] == "lifespan.startup.complete"
    finally:
        await middleware.close()


def test_the_wsgi_middleware_refuses_to_start_on_an_unmigrated_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never-migrated.db'}?auto_migrate=false"
    with pytest.raises(SchemaError, match="idemstore migrate sqlite:///"):
        WSGIMiddleware(lambda environ, start_response: [], store=url)


async def test_a_consumer_stops_before_its_first_handler_on_an_unmigrated_database(
    tmp_path: Path,
) -> None:
    ran: list[object] = []

    async def handler(message: object) -> None:
        ran.append(message)

    # Not entered: a consumer is handed a store it opens lazily, as a URL's store is.
    store = open_store(f"sqlite:///{tmp_path / 'never-migrated.db'}?auto_migrate=false")
    door = ConsumerDoor(Idempotency(store))
    try:
        with pytest.raises(SchemaError, match="idemstore migrate"):
            await handle_all(door, [], handler)
    finally:
        await store.close()
    assert ran == []


async def test_store_ready_is_what_the_gateways_readyz_asks(postgres_server: str) -> None:
    schema = f"never_{uuid.uuid4().hex[:8]}"
    async with open_store(f"{postgres_server}?schema={schema}") as store:
        with pytest.raises(SchemaError, match=f"schema={schema}"):
            await store_ready(store)
