"""The WSGI middleware under gunicorn with two worker processes: duplicates storming both
workers at once run the side effect once per key."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import httpx
import pytest

from idemstore.local_servers import free_port
from tests.loopback_process import Child

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow


@pytest.fixture(params=["redis", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    store_url = request.getfixturevalue(f"{request.param}_store_url")
    effects = tmp_path / "effects.txt"
    effects.touch()
    with gunicorn("tests.wsgi.apps:gunicorn_app()", store_url, effects, tmp_path) as url:
        yield url, effects


@contextlib.contextmanager
def gunicorn(app: str, store_url: str, effects: Path, tmp_path: Path) -> Iterator[str]:
    """``app`` under gunicorn with two workers of four threads on a free loopback port;
    the app finds the store and the effects file in its environment."""
    command = [sys.executable, "-m", "gunicorn", "--workers", "2", "--threads", "4", app]
    with server(
        lambda port: [*command, "--bind", f"127.0.0.1:{port}"], store_url, effects, tmp_path
    ) as url:
        yield url


@contextlib.contextmanager
def server(
    command: Callable[[int], list[str]], store_url: str, effects: Path, tmp_path: Path
) -> Iterator[str]:
    """A server started by ``command(port)`` on a free loopback port; the app it serves finds
    the store and the effects file in its environment."""
    port = free_port()
    env = {"IDEMSTORE_TEST_STORE": store_url, "IDEMSTORE_TEST_EFFECTS": str(effects)}
    log = tmp_path / "gunicorn.log"
    with Child(command(port), port, log, env=env, stop_timeout=15):
        yield f"http://127.0.0.1:{port}"


def storm_and_retry(url: str, path: str, keys: list[str], copies: int) -> list[httpx.Response]:
    """``copies`` concurrent duplicates of a POST per key, on separate connections (so that
    gunicorn spreads them over its workers); then one retry per key, returned."""
    headers = {"Authorization": "Bearer alice", "X-Test-User": "alice"}

    def request(client: httpx.AsyncClient, key: str) -> Awaitable[httpx.Response]:
        return client.post(
            path, json={"key": key}, headers={**headers, "Idempotency-Key": f'"{key}"'}
        )

    async def storm() -> list[httpx.Response]:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
            stormed = await asyncio.gather(
                *(request(client, k) for k in keys for _ in range(copies))
            )
            assert {r.status_code for r in stormed} <= {201, 409}
            return [await request(client, key) for key in keys]

    return asyncio.run(storm())


def test_duplicate_storms_across_workers_run_each_effect_once(served: tuple[str, Path]) -> None:
    url, effects = served
    keys = [uuid.uuid4().hex for _ in range(6)]
    retries = storm_and_retry(url, "/orders?sleep=0.3", keys, copies=6)
    executed = Counter(line.split()[0].strip('"') for line in effects.read_text().splitlines())
    assert executed == dict.fromkeys(keys, 1)
    assert all(r.status_code == 201 and r.headers["idempotent-replayed"] == "true" for r in retries)
    assert len(effects.read_text().splitlines()) == len(keys)


@pytest.fixture(scope="module")
def gunicorn_over_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The app under gunicorn (two workers: a retry may land on either) over one SQLite file."""
    tmp_path = tmp_path_factory.mktemp("gunicorn")
    effects = tmp_path / "effects.txt"
    effects.touch()
    store_url = f"sqlite:///{tmp_path / 'idem.db'}"
    with gunicorn("tests.wsgi.apps:gunicorn_app()", store_url, effects, tmp_path) as url:
        yield url, effects


def runs(effects: Path, key: str) -> int:
    """How many times the app's work ran under ``key``, in either worker."""
    return effects.read_text().split().count(f'"{key}"')


def alice(key: str) -> dict[str, str]:
    return {"Authorization": "Bearer alice", "Idempotency-Key": f'"{key}"'}


def test_a_streamed_wsgi_response_arrives_as_produced_and_replays_byte_identical(
    gunicorn_over_sqlite: tuple[str, Path],
) -> None:
    url, effects = gunicorn_over_sqlite
    key = f"wsgi-sse-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, timeout=20) as client:
        path = "/ticks?events=50&delay=0.01"
        with client.stream("POST", path, headers=alice(key)) as original:
            pieces = list(original.iter_raw())
            first = b"".join(pieces)
        # Sent as the app yielded it: many pieces, not one buffered body.
        assert len(pieces) > 5
        assert first.count(b"\n\n") == 50
        again = client.post(path, headers=alice(key))
        assert again.content == first
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Content-Type"].startswith("text/event-stream")
    assert runs(effects, key) == 1


def test_a_3_mb_wsgi_response_runs_once_and_its_retries_get_the_refusal(
    gunicorn_over_sqlite: tuple[str, Path],
) -> None:
    url, effects = gunicorn_over_sqlite
    key = f"wsgi-big-{uuid.uuid4().hex[:8]}"
    size = 3 * 1024 * 1024
    with httpx.Client(base_url=url, timeout=20) as client:
        first = client.post(f"/big?size={size}", headers=alice(key))
        assert first.status_code == 200 and len(first.content) == size
        retry = client.post(f"/big?size={size}", headers=alice(key))
        assert retry.status_code == 409
        assert retry.json()["type"].endswith("#outcome_unrecorded")
        assert f"{size} bytes" in retry.json()["detail"]
    assert runs(effects, key) == 1


def test_a_wsgi_stream_cut_mid_way_is_released_and_its_retry_runs(
    gunicorn_over_sqlite: tuple[str, Path],
) -> None:
    url, effects = gunicorn_over_sqlite
    key = f"wsgi-cut-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, timeout=20) as client:
        for _ in range(2):
            # The server closes the connection mid-body: the client sees an incomplete stream.
            with pytest.raises(httpx.RemoteProtocolError):
                client.post("/ticks?events=50&cut=10", headers=alice(key))
    # Not an outcome: the key was released, so the retry ran the work again.
    assert runs(effects, key) == 2
