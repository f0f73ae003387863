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
    from pathlib import Path

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_duplicate_storms_across_workers_run_each_view_once(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    store_url = request.getfixturevalue(f"{backend}_store_url")
    effects = tmp_path / "effects.txt"
    effects.touch()
    app = "tests.django_middleware.project:wsgi_application()"
    keys = [uuid.uuid4().hex for _ in range(6)]
    with gunicorn(app, store_url, effects, tmp_path) as url:
        retries = storm_and_retry(url, "/orders?sleep=0.3", keys, copies=6)
    executed = Counter(line.split()[0].strip('"') for line in effects.read_text().splitlines())
    assert executed == dict.fromkeys(keys, 1)
    assert all(r.status_code == 201 and r.headers["idempotent-replayed"] == "true" for r in retries)


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_duplicate_storms_on_uvicorn_workers_run_each_async_view_once(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    store_url = request.getfixturevalue(f"{backend}_store_url")
    effects = tmp_path / "effects.txt"
    effects.touch()
    app = "tests.django_middleware.project:asgi_application"
    keys = [uuid.uuid4().hex for _ in range(6)]

    def uvicorn(port: int) -> list[str]:
        return [
            *(sys.executable, "-m", "uvicorn", app, "--factory", "--workers", "2"),
            *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
        ]

    with server(uvicorn, store_url, effects, tmp_path) as url:
        retries = storm_and_retry(url, "/async-orders", keys, copies=6)
    executed = Counter(line.split()[0].strip('"') for line in effects.read_text().splitlines())
    assert executed == dict.fromkeys(keys, 1)
    assert all(r.status_code == 201 and r.headers["idempotent-replayed"] == "true" for r in retries)
