"""The Django middleware under real servers with two worker processes (gunicorn for sync
views, uvicorn for async ones): duplicate storms across both workers run each view once."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from tests.wsgi.test_gunicorn import gunicorn, server, storm_and_retry

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from pathlib import Path

pytestmark = pytest.mark.slow


@pytest.fixture(params=["redis", "postgres"])
def shared_store_url(request: pytest.FixtureRequest) -> str:
    """A store both worker processes reach (a memory store would be one per worker)."""
    return str(request.getfixturevalue(f"{request.param}_store_url"))


def assert_storms_run_each_view_once(
    serve: Callable[[Path], AbstractContextManager[str]], path: str, tmp_path: Path
) -> None:
    """Duplicate storms on six keys against the server ``serve(effects)`` starts: each view
    ran once per key (by the effects file) and every retry was the replayed 201."""
    effects = tmp_path / "effects.txt"
    effects.touch()
    keys = [uuid.uuid4().hex for _ in range(6)]
    with serve(effects) as url:
        retries = storm_and_retry(url, path, keys, copies=6)
    executed = Counter(line.split()[0].strip('"') for line in effects.read_text().splitlines())
    assert executed == dict.fromkeys(keys, 1)
    assert all(r.status_code == 201 and r.headers["idempotent-replayed"] == "true" for r in retries)


def test_duplicate_storms_across_workers_run_each_view_once(
    shared_store_url: str, tmp_path: Path
) -> None:
    app = "tests.django_middleware.project:wsgi_application()"
    assert_storms_run_each_view_once(
        lambda effects: gunicorn(app, shared_store_url, effects, tmp_path),
        "/orders?sleep=0.3",
        tmp_path,
    )


def test_duplicate_storms_on_uvicorn_workers_run_each_async_view_once(
    shared_store_url: str, tmp_path: Path
) -> None:
    app = "tests.django_middleware.project:asgi_application"

    def uvicorn(port: int) -> list[str]:
        return [
            *(sys.executable, "-m", "uvicorn", app, "--factory", "--workers", "2"),
            *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
        ]

    assert_storms_run_each_view_once(
        lambda effects: server(uvicorn, shared_store_url, effects, tmp_path),
        "/async-orders",
        tmp_path,
    )
